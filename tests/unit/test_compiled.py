"""scripts/build_compiled.py and coordinator/compiled.py (`serve --compiled`): a compiled module runs only while
every source it was compiled against matches the one being run, and only beside its compiled imports.

A three-module package is compiled once (seconds): `low` (a Final constant mypyc copies into its importers),
`mid` (imports low), `solo` (imports nothing). Each case runs in a fresh interpreter, as the service would."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from coordinator import cli, compiled

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = str(sysconfig.get_config_var("EXT_SUFFIX"))
SOURCES = {
    "natdemo/__init__.py": "",
    "natdemo/low.py": "from typing import Final\n\nLIMIT: Final = 7\n\n\ndef answer() -> int:\n    return LIMIT * 6\n",
    "natdemo/mid.py": "from natdemo.low import LIMIT, answer\n\n\ndef twice() -> int:\n    return answer() * 2 + LIMIT\n",
    "natdemo/solo.py": "def name() -> str:\n    return 'solo'\n",
    "natdemo/base.py": "class Base:\n    def kind(self) -> str:\n        return 'base'\n",
    "natdemo/heir.py": "from natdemo.base import Base\n\n\nclass Heir(Base):\n    pass\n",
}
RUN = """
import json, sys
from pathlib import Path
from coordinator import compiled
if sys.argv[2:]:
    import natdemo.low
decision = compiled.install(Path(sys.argv[1]))
from natdemo import low, mid, solo
print(json.dumps({"summary": decision.summary(), "fell_back": decision.fell_back,
                  "files": {m.__name__: m.__file__ for m in (low, mid, solo)},
                  "values": [low.answer(), mid.twice(), solo.name()]}))
"""


def _why_no_build() -> str | None:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler}): scripts/setup.sh installs gcc where it can"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "no Python headers (Python.h)"
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc is not installed (mypy, the test extra)"
    return None


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree with natdemo's three modules compiled into tree/build/compiled."""
    why = _why_no_build()
    if why:
        pytest.skip(why)
    tree = tmp_path_factory.mktemp("compiled") / "tree"
    for path, text in SOURCES.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
    (tree / "modules.txt").write_text("natdemo/low.py\nnatdemo/mid.py\nnatdemo/solo.py\nnatdemo/base.py\n"
                                      "natdemo/heir.py\n")
    build = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_compiled.py"), "--source-root", str(tree),
                            "--modules", str(tree / "modules.txt"), "--out", str(tree / "build" / "compiled")],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    return tree


def _copy(tree: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    shutil.copytree(tree, copy)
    return copy


def _run(tree: Path, *, import_low_first: bool = False) -> dict[str, Any]:
    process = subprocess.run([sys.executable, "-c", RUN, str(tree / "build" / "compiled"),
                              *(["first"] if import_low_first else [])], cwd=tree, capture_output=True, text=True,
                             env={"PYTHONPATH": f"{tree}:{ROOT}", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert process.returncode == 0, process.stderr
    result: dict[str, Any] = json.loads(process.stdout.strip().splitlines()[-1])
    return result


def _compiled(result: dict[str, Any], tree: Path) -> dict[str, bool]:
    build = str(tree / "build" / "compiled")
    return {name.removeprefix("natdemo."): file.startswith(build) and file.endswith(SUFFIX)
            for name, file in result["files"].items()}


def test_a_build_matching_its_sources_runs_compiled(built: Path) -> None:
    result = _run(built)
    assert _compiled(result, built) == {"low": True, "mid": True, "solo": True}
    assert result["values"] == [42, 91, "solo"]
    assert result["fell_back"] == {}
    assert result["summary"].startswith("compiled modules: 5 of 5 run compiled")


def test_an_edited_source_runs_pure_and_so_does_every_module_compiled_against_it(built: Path, tmp_path: Path) -> None:
    tree = _copy(built, tmp_path)
    low = tree / "natdemo" / "low.py"
    low.write_text(low.read_text().replace("LIMIT: Final = 7", "LIMIT: Final = 8"))
    # a stale extension beside the edited source, as an in-place build leaves it: it must not win the import
    shutil.copy(tree / "build" / "compiled" / "natdemo" / f"low{SUFFIX}", tree / "natdemo" / f"low{SUFFIX}")
    result = _run(tree)
    assert _compiled(result, tree) == {"low": False, "mid": False, "solo": True}
    assert result["files"]["natdemo.low"] == str(low)
    assert result["values"] == [48, 104, "solo"]  # compiled mid would answer 7 * 6 * 2 + 7 = 91
    assert result["fell_back"] == {"natdemo.low": "its source changed since the build",
                                   "natdemo.mid": "natdemo/low.py changed since the build"}
    assert "3 of 5 run compiled" in result["summary"]
    assert "its source changed since the build: natdemo.low" in result["summary"]


HEIR = """
import json, sys
from pathlib import Path
from coordinator import compiled
decision = compiled.install(Path(sys.argv[1]))
from natdemo import base, heir
print(json.dumps({"fell_back": decision.fell_back, "files": [base.__file__, heir.__file__],
                  "kind": heir.Heir().kind()}))
"""


def test_an_edited_subclass_takes_its_compiled_base_module_to_its_source_too(built: Path, tmp_path: Path) -> None:
    """A class run from its source cannot subclass a compiled one (mypyc: "interpreted classes cannot inherit from
    compiled"): the edited heir's base module falls back with it, and the service still starts."""
    tree = _copy(built, tmp_path)
    manifest = json.loads((tree / "build" / "compiled" / "manifest.json").read_text())
    assert manifest["modules"]["natdemo.heir"]["bases_from"] == ["natdemo.base"]
    heir = tree / "natdemo" / "heir.py"
    heir.write_text(heir.read_text().replace("    pass", "    def kind(self) -> str:\n        return 'heir'"))
    process = subprocess.run([sys.executable, "-c", HEIR, str(tree / "build" / "compiled")], cwd=tree,
                             capture_output=True, text=True, env={"PYTHONPATH": f"{tree}:{ROOT}", "PATH": "/usr/bin:/bin"},
                             timeout=60)
    assert process.returncode == 0, process.stderr  # before: TypeError at `class Heir(Base)`
    result = json.loads(process.stdout.strip().splitlines()[-1])
    assert result["kind"] == "heir"
    assert all(file.endswith(".py") for file in result["files"])
    assert result["fell_back"] == {"natdemo.heir": "its source changed since the build",
                                   "natdemo.base": "natdemo.heir, which fell back, subclasses its classes"}


def test_a_module_imported_before_the_install_stays_pure_and_so_do_its_importers(built: Path) -> None:
    result = _run(built, import_low_first=True)
    assert _compiled(result, built) == {"low": False, "mid": False, "solo": True}
    assert result["values"] == [42, 91, "solo"]
    assert result["fell_back"] == {"natdemo.low": "imported before the compiled modules were installed",
                                   "natdemo.mid": "imports compiled natdemo.low, which fell back"}


def test_a_missing_build_falls_back_whole_and_no_option_installs_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compiled.ENVIRONMENT, raising=False)
    monkeypatch.setattr(compiled, "DEFAULT_DIRECTORY", tmp_path / "no-build")
    finders = list(sys.meta_path)
    decision, no_build = cli._install_compiled(["serve", "--listen", "127.0.0.1:0"])
    assert decision is None and no_build is not None and "no build" in no_build
    assert sys.meta_path == finders
    try:
        decision, _ = cli._install_compiled(["serve", "--compiled", str(tmp_path / "none")])
        assert decision.compiled == {}
        assert "no usable build" in decision.fell_back["*"]
        monkeypatch.setenv(compiled.ENVIRONMENT, str(tmp_path / "other"))
        assert cli._install_compiled(["serve"])[0].directory == tmp_path / "other"
        assert compiled.directory_asked("1") == compiled.directory_asked("default") == compiled.DEFAULT_DIRECTORY
    finally:
        sys.meta_path[:] = finders


def test_serve_and_demo_run_this_trees_build_by_default_and_pure_when_told(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --compiled or --pure, the commands that run the service install this tree's build when it has one;
    the other commands never do, nor --pure or COORDINATOR_COMPILED=0."""
    build = tmp_path / "build"
    build.mkdir()
    (build / compiled.MANIFEST).write_text(json.dumps({"format": compiled.FORMAT, "built_from": "test",
                                                        "extension_suffix": compiled.extension_suffix(),
                                                        "modules": {}, "sources": {}}))
    monkeypatch.setattr(compiled, "DEFAULT_DIRECTORY", build)
    monkeypatch.delenv(compiled.ENVIRONMENT, raising=False)
    finders = list(sys.meta_path)
    try:
        for argv in (["serve"], ["--log-level", "DEBUG", "serve", "--listen", "127.0.0.1:0"],
                     ["--event-loop=asyncio", "demo", "--state-dir", "x"]):
            decision, no_build = cli._install_compiled(argv)
            assert decision is not None and decision.directory == build.resolve() and no_build is None, argv
            sys.meta_path[:] = finders
        for argv in (["serve", "--pure"], ["demo", "--pure"], ["simulate"], ["kafka"], ["--log-level", "INFO"]):
            assert cli._install_compiled(argv) == (None, None), argv
        monkeypatch.setenv(compiled.ENVIRONMENT, "0")
        assert cli._install_compiled(["serve"]) == (None, None)
        assert sys.meta_path == finders
    finally:
        sys.meta_path[:] = finders
