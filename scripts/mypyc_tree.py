"""A copy of one commit's tree with some of its modules compiled by mypyc in place, for measuring (bench/):
never the tree you edit (a compiled `.so` beside its `.py` wins the import, so an edited source would run old code).

  python scripts/mypyc_tree.py OUT [--commit HEAD] [--modules FILE] [--retry N] [--opt-level 3]

OUT is emptied, filled with `git archive COMMIT`, and the modules listed in FILE (one path a line, `#` comments;
default scripts/mypyc_modules.txt) are compiled into one shared library beside them (mypyc's `mypycify`,
`build_ext --inplace`). The project's mypy settings come from pyproject.toml's [tool.mypy], written to OUT/mypyc.ini
without `files` and `warn_unused_configs` (with only some modules compiled, mypyc stops on mypy's "unused section"
note otherwise) and with the cache inside OUT. A module mypyc refuses (a mypyc error in it) is left out and the
build tried again, up to N times; the refused modules and mypyc's reasons are printed and written to
OUT/mypyc-refused.txt. Last, a fresh interpreter run from OUT (its working directory and PYTHONPATH, as
bench.coordinator runs a tree's server) imports every module and says which were loaded from a `.so`.
Needs a C compiler and Python's headers; nothing here is part of the default setup, the tests or CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUP = """\
import sys
from setuptools import setup
from mypyc.build import mypycify

modules = [line.strip() for line in open("mypyc-modules.txt") if line.strip()]
setup(name="mypyc_tree", ext_modules=mypycify(["--config-file", "mypyc.ini", *modules], opt_level={opt!r}))
"""
ERROR = re.compile(r"^(?P<path>[\w/.]+\.py):(?P<line>\d+): error: (?P<message>.*)$")


def mypy_ini(pyproject: Path, cache_dir: str) -> str:
    """pyproject's [tool.mypy] as a mypy .ini, without `files` and `warn_unused_configs`."""
    settings = tomllib.loads(pyproject.read_text())["tool"]["mypy"]
    sections = [("mypy", {k: v for k, v in settings.items()
                          if k not in ("files", "warn_unused_configs", "overrides", "cache_dir")}
                 | {"cache_dir": cache_dir})]
    for override in settings.get("overrides", []):
        modules = override["module"]
        name = "mypy-" + ",".join(modules if isinstance(modules, list) else [modules])
        sections.append((name, {k: v for k, v in override.items() if k != "module"}))
    lines = []
    for name, values in sections:
        lines.append(f"[{name}]")
        for key, value in values.items():
            text = str(value) if not isinstance(value, list) else ",".join(map(str, value))
            lines.append(f"{key} = {text}")
        lines.append("")
    return "\n".join(lines)


def read_modules(path: Path) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()
            if line.split("#", 1)[0].strip()]


def build(out: Path, modules: list[str], opt_level: str) -> tuple[int, str]:
    (out / "mypyc-modules.txt").write_text("\n".join(modules) + "\n")
    (out / "mypyc_setup.py").write_text(SETUP.format(opt=opt_level))
    process = subprocess.run(["nice", "-n", "19", sys.executable, "mypyc_setup.py", "build_ext", "--inplace"],
                             cwd=out, capture_output=True, text=True)
    return process.returncode, process.stdout + process.stderr


def build_refusing(out: Path, modules: list[str], opt_level: str,
                   retry: int) -> tuple[list[str], dict[str, list[str]], str | None]:
    """Build; a module mypyc refuses (an error line in it) is left out and the build tried again, up to `retry`
    builds. Returns the modules built, the refused ones with mypyc's reasons, and why the build failed (None: it
    did not); mypyc's output of the last build is in OUT/mypyc-build.log."""
    refused: dict[str, list[str]] = {}
    for _ in range(retry):
        status, output = build(out, modules, opt_level)
        (out / "mypyc-build.log").write_text(output)
        if status == 0:
            return modules, refused, None
        errors: dict[str, list[str]] = {}
        for line in output.splitlines():
            match = ERROR.match(line)
            if match:
                errors.setdefault(match["path"], []).append(f"{match['line']}: {match['message']}")
        outside = [path for path in errors if path not in modules]
        if not errors or outside:
            print(output[-4000:], file=sys.stderr)
            why = "errors outside the compiled modules: " + ", ".join(outside) if outside else "no error line"
            return modules, refused, f"build failed ({why}), log in {out / 'mypyc-build.log'}"
        refused.update(errors)
        modules = [m for m in modules if m not in errors]
    return modules, refused, f"still failing after {retry} builds, log in {out / 'mypyc-build.log'}"


def check_imports(out: Path, modules: list[str]) -> dict[str, str]:
    """Each module's `__file__`, imported by a fresh interpreter with OUT as its working directory and PYTHONPATH."""
    names = [m.removesuffix(".py").replace("/", ".") for m in modules]
    code = ("import importlib, json, sys\n"
            f"print(json.dumps({{n: importlib.import_module(n).__file__ for n in {names!r}}}))")
    process = subprocess.run([sys.executable, "-c", code], cwd=out, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(out)}, check=True)
    return json.loads(process.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--commit", default="HEAD")
    parser.add_argument("--modules", type=Path, default=ROOT / "scripts" / "mypyc_modules.txt")
    parser.add_argument("--retry", type=int, default=6, help="builds tried, each without the modules refused before")
    parser.add_argument("--opt-level", default="3")
    args = parser.parse_args()
    out: Path = args.out.resolve()
    if out == ROOT or ROOT in out.parents:
        parser.error("OUT must lie outside this tree")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", args.commit], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    (out / "mypyc.ini").write_text(mypy_ini(out / "pyproject.toml", str(out / ".mypyc_cache")))
    modules = read_modules(args.modules)
    modules, refused, failure = build_refusing(out, modules, args.opt_level, args.retry)
    if failure:
        print(f"mypyc_tree: {failure}", file=sys.stderr)
        return 1
    (out / "mypyc-refused.txt").write_text("".join(f"{path}\n" + "".join(f"  {e}\n" for e in reasons)
                                                   for path, reasons in refused.items()))
    loaded = check_imports(out, modules)
    compiled = [name for name, file in loaded.items() if file and file.endswith(".so")]
    print(json.dumps({"tree": str(out), "commit": args.commit, "compiled": len(compiled), "of": len(modules),
                      "not_compiled_though_listed": sorted(set(loaded) - set(compiled)),
                      "refused": {path: reasons[:3] for path, reasons in refused.items()}}, indent=1))
    return 0 if len(compiled) == len(modules) else 1


if __name__ == "__main__":
    sys.exit(main())
