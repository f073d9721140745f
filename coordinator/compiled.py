"""Modules compiled by mypyc (scripts/build_compiled.py), run in place of their sources where they cannot run stale
code: by `coordinator serve` and `demo` from this tree's build/compiled when it exists (scripts/setup.sh makes it),
from another build with `--compiled DIR`, never with `--pure` (env COORDINATOR_COMPILED: 1, DIR or 0).

A build directory holds one extension per compiled module, mypyc's shared library for the group, and
manifest.json: each module's source path and the SHA-256 of every project source it was compiled against (its own
and every project module it imports, directly or through others, `if TYPE_CHECKING:` imports included). That set,
not the module's own source alone, decides, because mypyc's code reaches into other modules at build time: a call
to another compiled module is a direct C call into that module's compiled code, a `Final` constant of any module is
copied into the caller. So a compiled module runs only when every one of those sources, as found where the running
`coordinator` and `protocol` packages are, still has the hash it had at the build; and only when every compiled
module it imports runs compiled too (its C calls need that module's compiled state initialised, not the pure
module's; and mypyc's library makes a compiled module's compiled imports itself, past this finder). Every other listed module is loaded from its `.py` explicitly (never a stale `.so` left beside it).
Decided once, before the modules are imported; a module imported before that stays pure, and so do its dependents.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ENVIRONMENT = "COORDINATOR_COMPILED"
MANIFEST = "manifest.json"
FORMAT = 2  # 2: each module's compiled bases (bases_from)
DEFAULT_DIRECTORY = Path(__file__).resolve().parent.parent / "build" / "compiled"


def extension_suffix() -> str:
    return str(sysconfig.get_config_var("EXT_SUFFIX"))


def sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


@dataclass
class Decision:
    """Which listed modules run compiled (module → extension) and which fell back (module → why)."""

    directory: Path
    built_from: str = "?"
    compiled: dict[str, Path] = field(default_factory=dict)
    fell_back: dict[str, str] = field(default_factory=dict)
    pure: dict[str, Path] = field(default_factory=dict)  # every fallen-back module's running source
    library: tuple[str, Path] | None = None  # mypyc's shared library of the group: import name, file

    def summary(self) -> str:
        """One log line: how many run compiled, which, and each reason for falling back with its modules."""
        total = len(self.compiled) + len(self.fell_back)
        line = (f"compiled modules: {len(self.compiled)} of {total} run compiled, directory={self.directory} "
                f"built_from={self.built_from}")
        if self.compiled:
            line += f" compiled=[{', '.join(sorted(self.compiled))}]"
        by_reason: dict[str, list[str]] = {}
        for module, reason in sorted(self.fell_back.items()):
            by_reason.setdefault(reason, []).append(module)
        if by_reason:
            line += " fell_back=[" + "; ".join(f"{reason}: {', '.join(modules)}"
                                               for reason, modules in by_reason.items()) + "]"
        return line


class CompiledFinder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: each listed module from its extension in the build or, fallen back, from its `.py`;
    mypyc's shared library by its import name. Nothing else."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        self._extensions = dict(decision.compiled)
        if decision.library is not None:
            self._extensions[decision.library[0]] = decision.library[1]

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        extension = self._extensions.get(fullname)
        if extension is not None:
            loader: importlib.abc.Loader = importlib.machinery.ExtensionFileLoader(fullname, str(extension))
            return importlib.util.spec_from_file_location(fullname, extension, loader=loader)
        source = self.decision.pure.get(fullname)
        if source is not None:
            loader = importlib.machinery.SourceFileLoader(fullname, str(source))
            return importlib.util.spec_from_file_location(fullname, source, loader=loader)
        return None


def _running_root(top: str) -> Path | None:
    """The directory holding top-level package (or module) `top` as this interpreter would import it, found
    without importing it."""
    module = sys.modules.get(top)
    spec = module.__spec__ if module is not None else importlib.machinery.PathFinder.find_spec(top)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).parent
    return Path(spec.origin).parent if spec.origin else None


def decide(directory: Path) -> Decision:
    """Read the build's manifest and hash the running sources; imports nothing of the listed modules."""
    directory = directory.resolve()
    decision = Decision(directory)
    try:
        manifest: dict[str, Any] = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError) as error:
        decision.fell_back["*"] = f"no usable build ({type(error).__name__}: {error}; run scripts/build_compiled.py)"
        return decision
    decision.built_from = str(manifest.get("built_from", "?"))
    modules: dict[str, dict[str, Any]] = manifest.get("modules", {})
    roots: dict[str, Path | None] = {}

    def running(relative: str) -> Path | None:
        top = relative.split("/", 1)[0].removesuffix(".py")
        if top not in roots:
            roots[top] = _running_root(top)
        root = roots[top]
        return None if root is None else root / relative

    changed: dict[str, str] = {}
    for relative, digest in manifest.get("sources", {}).items():
        path = running(relative)
        now = sha256(path) if path is not None else None
        if now != digest:
            changed[relative] = "missing" if now is None else "changed"
    whole_build = None
    if manifest.get("format") != FORMAT:
        whole_build = f"manifest format {manifest.get('format')}, this loader reads {FORMAT}"
    elif manifest.get("extension_suffix") != extension_suffix():
        whole_build = f"built for {manifest.get('extension_suffix')}, this interpreter loads {extension_suffix()}"
    library = manifest.get("library")
    if library is not None and whole_build is None:
        decision.library = (library["name"], directory / library["file"])
        if not decision.library[1].is_file():
            whole_build = f"its shared library {library['file']} is missing"

    own: dict[str, str] = {}  # reasons that are the module's own, before its dependencies are looked at
    for name, entry in modules.items():
        source = entry["source"]
        if whole_build is not None:
            own[name] = whole_build
        elif name in sys.modules:
            own[name] = "imported before the compiled modules were installed"
        elif not (directory / entry["file"]).is_file():
            own[name] = "its extension is missing from the build"
        elif source in changed:
            own[name] = f"its source {changed[source]} since the build"
        else:
            stale = sorted(path for path in entry["inputs"] if path in changed)
            if stale:
                own[name] = f"{stale[0]} {changed[stale[0]]} since the build" + (
                    f" (and {len(stale) - 1} more of the sources it was compiled against)" if len(stale) > 1 else "")
    # Closed over both ways, to a fixed point: a compiled module beside an importer's fallen-back compiled import
    # would run that import's old code; a fallen-back module's class on a compiled base cannot be defined at all.
    fell_back = dict(own)
    subclassed_by: dict[str, list[str]] = {}
    for name, entry in modules.items():
        for base_module in entry.get("bases_from", ()):
            subclassed_by.setdefault(base_module, []).append(name)
    spreading = True
    while spreading:
        spreading = False
        for name, entry in modules.items():
            if name in fell_back:
                continue
            fallen = sorted(dep for dep in entry["compiled_inputs"] if dep in fell_back)
            heirs = sorted(sub for sub in subclassed_by.get(name, ()) if sub in fell_back)
            if fallen:
                fell_back[name] = f"imports compiled {fallen[0]}, which fell back"
            elif heirs:
                fell_back[name] = f"{heirs[0]}, which fell back, subclasses its classes"
            else:
                continue
            spreading = True
    for name, entry in modules.items():
        if name not in fell_back:
            decision.compiled[name] = directory / entry["file"]
            continue
        decision.fell_back[name] = fell_back[name]
        path = running(entry["source"])
        if path is not None and name not in sys.modules:
            decision.pure[name] = path
    return decision


def install(directory: Path | None = None) -> Decision:
    """Decide, then put the finder first on sys.meta_path and load mypyc's shared library (which runs none of the
    modules): a library that does not load (another Python, a missing symbol) sends every module to its source."""
    decision = decide(directory or DEFAULT_DIRECTORY)
    finder = CompiledFinder(decision)
    sys.meta_path.insert(0, finder)
    if decision.library is not None and decision.compiled:
        try:
            importlib.import_module(decision.library[0])
        except ImportError as error:
            reason = f"its shared library did not load ({error})"
            for name in list(decision.compiled):
                decision.fell_back[name] = reason
            decision.compiled.clear()
            finder._extensions.clear()
    return decision


def directory_asked(value: str | None) -> Path | None:
    """The build directory a `--compiled` value or COORDINATOR_COMPILED names: None or '' (unset), '0', 'false',
    'no' or 'pure' is none; '1', 'true', 'yes' or the bare flag (the constant "default") is this tree's
    build/compiled; anything else a path."""
    if value is None or value.strip().lower() in ("", "0", "false", "no", "pure"):
        return None
    if value.strip().lower() in ("1", "true", "yes", "default"):
        return DEFAULT_DIRECTORY
    return Path(value)


def default_directory() -> Path | None:
    """What `serve` and `demo` run when told neither --compiled nor --pure: this tree's build when it has one (a
    manifest; its modules still checked one by one), else None: every module its source."""
    return DEFAULT_DIRECTORY if (DEFAULT_DIRECTORY / MANIFEST).is_file() else None


def running_compiled(names: Sequence[str]) -> dict[str, bool]:
    """For each imported module of `names`, whether its `__file__` is an extension (the check every measurement
    makes: a compiled tree's module can be shadowed by a source on the path, and the other way round)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return {name: (getattr(sys.modules[name], "__file__", None) or "").endswith(suffixes)
            for name in names if name in sys.modules}


if __name__ == "__main__":  # python -m coordinator.compiled [DIR]: what `--compiled DIR` would run; 1 if any falls back
    verdict = decide(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIRECTORY)
    print(verdict.summary())
    sys.exit(1 if verdict.fell_back or not verdict.compiled else 0)
