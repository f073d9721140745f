"""Compile the listed modules with mypyc into a separate directory, for `coordinator serve` and `demo`, which
run this tree's build by default (`--pure`: the sources).

  python scripts/build_compiled.py [--out build/compiled] [--modules scripts/mypyc_modules.txt] [--opt-level 3]

The tree's Python sources as they are now (edits included) are copied to OUT.work, compiled there (mypyc's
`mypycify`, `build_ext --inplace`, the project's [tool.mypy] settings; a module mypyc refuses is left out, with its
reasons, and the build tried again), and only the extensions are moved to OUT (default build/compiled, git-ignored):
one per compiled module and mypyc's shared library. OUT/manifest.json records, per module, the SHA-256 of every
project source it was compiled against (its own and every project module it imports, directly or through others);
coordinator/compiled.py runs a compiled module only while all of them still match the sources being run, and
only while every compiled module it imports runs compiled too. The sources are never touched: no `.so` lands
beside a `.py` (which would win the import and run stale code after an edit).
Last, a fresh interpreter installs the build as `--compiled` would and imports every module; a module that does
not load from its extension fails the build (exit 1, the manifest set aside as manifest.rejected.json).
Needs a C compiler, Python's headers and mypy (the test extra); takes 5-7 minutes for the default list on 2 cores.
scripts/setup.sh runs it when the build is missing or a committed tree no longer matches it (so CI's clean clone
runs its integration tests' `coordinator serve` compiled); the unit tests import the sources.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mypyc_tree import build_refusing, mypy_ini, read_modules  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_DIRECTORIES = {"build", "dist", "node_modules", "__pycache__"}
FORMAT = 2  # coordinator/compiled.py's FORMAT


def source_files(root: Path, skip: set[Path]) -> list[Path]:
    """Every Python source under root (relative), outside hidden, build and cache directories."""
    found = []
    for directory, names, files in os.walk(root):
        here = Path(directory)
        names[:] = sorted(n for n in names if not n.startswith(".") and n not in SKIPPED_DIRECTORIES
                          and not n.endswith(".egg-info") and (here / n).resolve() not in skip)
        found += [(here / f).relative_to(root) for f in sorted(files) if f.endswith((".py", ".pyi"))]
    return found


def module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(relative: Path, tree: ast.Module) -> set[str]:
    """Every module an import statement anywhere in the file may load (`if TYPE_CHECKING:` and function-level
    imports included), with the packages above it: mypyc reads the types of all of them."""
    package = module_name(relative).split(".") if relative.name == "__init__.py" else \
        module_name(relative).split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            targets = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return names


def closures(root: Path, files: list[Path], compiled: list[str]) -> dict[str, set[Path]]:
    """Per compiled module, the project sources it imports directly or through others (itself included)."""
    by_name = {module_name(f): f for f in files if f.suffix == ".py"}
    edges: dict[str, set[str]] = {}
    for name, relative in by_name.items():
        try:
            tree = ast.parse((root / relative).read_bytes())
        except SyntaxError:
            tree = ast.Module(body=[], type_ignores=[])
        edges[name] = {n for n in imported_names(relative, tree) if n in by_name and n != name}
        parts = name.split(".")  # a module's packages run first
        edges[name].update(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in by_name)
    result = {}
    for name in compiled:
        seen, todo = {name}, [name]
        while todo:
            for dep in edges[todo.pop()]:
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        result[name] = {by_name[n] for n in seen}
    return result


def built_from(root: Path) -> str:
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git tree)"


VERIFY = """
import importlib, json, pkgutil, sys
from pathlib import Path
from coordinator import compiled
decision = compiled.install(Path(sys.argv[1]))
names = sys.argv[2:]
files = {n: importlib.import_module(n).__file__ for n in names}
failed_imports = {}
for top in sorted({n.split(".")[0] for n in names}):  # every module of the packages: their classes too
    package = importlib.import_module(top)
    for info in pkgutil.walk_packages(getattr(package, "__path__", []), top + "."):
        if not info.name.endswith("__main__"):
            try:
                importlib.import_module(info.name)
            except BaseException as error:
                failed_imports[info.name] = repr(error)[:200]
suffix = compiled.extension_suffix()
def is_compiled(module):
    return (getattr(sys.modules.get(module), "__file__", None) or "").endswith(suffix)
def native(cls):  # a mypyc extension class: no instance __dict__ (a Protocol compiles to a Python class)
    return cls.__dictoffset__ == 0 and not getattr(cls, "_is_protocol", False)
subclassed, helpers = [], []
bases_from = {}  # compiled module -> the other compiled modules whose classes its classes subclass
for name in names:
    for cls in [c for c in vars(sys.modules[name]).values() if isinstance(c, type) and c.__module__ == name]:
        for base in cls.__mro__[1:]:
            if base.__module__ in files and base.__module__ != name:
                bases_from.setdefault(name, set()).add(base.__module__)
for name in names:
    for cls in [c for c in vars(sys.modules[name]).values()
                if isinstance(c, type) and c.__module__ == name and native(c)]:
        todo = list(type.__subclasses__(cls))
        while todo:
            sub = todo.pop()
            todo.extend(type.__subclasses__(sub))
            if not is_compiled(sub.__module__):
                line = f"{sub.__module__}.{sub.__qualname__} subclasses compiled {name}.{cls.__qualname__}"
                (helpers if sub.__module__.rsplit(".", 1)[-1] == "testing" else subclassed).append(line)
print(json.dumps({"summary": decision.summary(), "files": files, "failed_imports": failed_imports,
                  "interpreted_subclasses": sorted(set(subclassed)), "in_test_helpers": sorted(set(helpers)),
                  "bases_from": {name: sorted(modules) for name, modules in bases_from.items()}}))
"""


def verify(out: Path, work: Path, names: list[str]) -> dict[str, Any]:
    """A fresh interpreter run from the copy of the sources (identical to the build's), with the loader of this
    tree: install OUT, import every listed module, then every module of their packages, and list each interpreted
    class that subclasses a compiled one (mypyc refuses to make one of its instances, not to define it); those in a
    `testing` module (helpers of the tests, which the compiled build does not serve) are listed apart."""
    process = subprocess.run([sys.executable, "-c", VERIFY, str(out), *names], cwd=work, capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(work), str(ROOT)])})
    if process.returncode != 0:
        return {"error": process.stderr[-3000:]}
    result: dict[str, Any] = json.loads(process.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "compiled",
                        help="the build directory, emptied first (default: build/compiled)")
    parser.add_argument("--modules", type=Path, default=ROOT / "scripts" / "mypyc_modules.txt",
                        help="paths of the modules to compile, one a line, # comments (default: %(default)s)")
    parser.add_argument("--source-root", type=Path, default=ROOT,
                        help="the tree whose modules are compiled (default: this one)")
    parser.add_argument("--opt-level", default="3", help="mypyc's C optimisation level (default: 3)")
    parser.add_argument("--retry", type=int, default=6, help="builds tried, each without the modules refused before")
    args = parser.parse_args()
    started = time.monotonic()
    root: Path = args.source_root.resolve()
    out: Path = args.out.resolve()
    work = out.parent / f"{out.name}.work"
    if out == root or out in root.parents:
        parser.error("--out must not be the source tree or hold it")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    origin = built_from(root)  # before the copy: what the copied sources came from
    files = source_files(root, {out, work})
    digests = {}
    for relative in files:  # the copy is what gets compiled and hashed: edits made during the build do not count
        (work / relative).parent.mkdir(parents=True, exist_ok=True)
        data = (root / relative).read_bytes()
        (work / relative).write_bytes(data)
        digests[relative.as_posix()] = hashlib.sha256(data).hexdigest()
    pyproject = root / "pyproject.toml"
    has_mypy = pyproject.is_file() and "mypy" in tomllib.loads(pyproject.read_text()).get("tool", {})
    if has_mypy:
        shutil.copy(pyproject, work / "pyproject.toml")
    (work / "mypyc.ini").write_text(mypy_ini(pyproject, str(work / ".mypyc_cache")) if has_mypy
                                    else f"[mypy]\ncache_dir = {work / '.mypyc_cache'}\n")
    modules, refused, failure = build_refusing(work, read_modules(args.modules), args.opt_level, args.retry)
    if failure:
        print(f"build_compiled: {failure}", file=sys.stderr)
        return 1
    suffix = str(sysconfig.get_config_var("EXT_SUFFIX"))
    libraries = sorted(p.name for p in work.glob(f"*__mypyc{suffix}"))
    if len(libraries) > 1:
        print(f"build_compiled: more than one mypyc library in {work}: {libraries}", file=sys.stderr)
        return 1
    names = {m: module_name(Path(m)) for m in modules}
    inputs = closures(work, files, list(names.values()))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    entries = {}
    for path, name in names.items():
        extension = Path(path).with_suffix("").as_posix() + suffix
        (out / extension).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(work / extension, out / extension)
        entries[name] = {"source": path, "file": extension,
                         "inputs": sorted(p.as_posix() for p in inputs[name]),
                         "compiled_inputs": sorted(module_name(p) for p in inputs[name]
                                                   if module_name(p) in names.values() and module_name(p) != name)}
    for library in libraries:
        shutil.copy2(work / library, out / library)
    for built in [*(work / e["file"] for e in entries.values()), *(work / lib for lib in libraries)]:
        built.unlink()  # the check below must load OUT's extensions, not these beside their sources
    used = sorted({p for entry in entries.values() for p in entry["inputs"]})
    manifest = {"format": FORMAT, "built_from": origin, "built_at": dt.datetime.now(dt.UTC).isoformat(
        timespec="seconds"), "source_root": str(root), "python": sys.version.split()[0], "extension_suffix": suffix,
        "mypy": _mypy_version(), "opt_level": args.opt_level,
        "library": {"name": libraries[0].removesuffix(suffix), "file": libraries[0]} if libraries else None,
        "modules": entries, "sources": {p: digests[p] for p in used},
        "refused": refused}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.copy(work / "mypyc-build.log", out / "build.log")
    checked = verify(out, work, list(names.values()))
    # Each module's compiled bases, for the loader: a module that falls back to its source cannot define a class on
    # a compiled base ("interpreted classes cannot inherit from compiled"), so the base's module falls back with it.
    for name, entry in entries.items():
        entry["bases_from"] = checked.get("bases_from", {}).get(name, [])
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    files_loaded = checked.get("files", {})
    not_compiled = sorted(n for n in names.values() if not str(files_loaded.get(n) or "").endswith(suffix))
    report = {"out": str(out), "built_from": manifest["built_from"], "compiled": len(names) - len(not_compiled),
              "of": len(names), "not_loaded_compiled": not_compiled,
              "interpreted_subclasses": checked.get("interpreted_subclasses"),
              "interpreted_subclasses_in_test_helpers (tests only)": checked.get("in_test_helpers"),
              "imports_failed_while_checking": checked.get("failed_imports"), "refused": {p: r[:3] for p, r in refused.items()},
              "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(report, indent=1))
    if "error" in checked or not_compiled or checked.get("interpreted_subclasses"):
        print(checked.get("error") or checked.get("summary"), file=sys.stderr)
        (out / "manifest.json").rename(out / "manifest.rejected.json")
        print("build_compiled: the build does not load as built; manifest set aside", file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _mypy_version() -> str:
    try:
        from mypy.version import __version__
    except ImportError:
        return "?"
    return str(__version__)


if __name__ == "__main__":
    sys.exit(main())
