"""The suite's own layout: a test module imports helpers from tests/support (or the fuzz harness), never from
another test module, so a test file can change or go without breaking others; and support never imports tests."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SUITE_DIRS = ("unit", "integration", "interop", "analytics")


def imported_modules(source: str, package: str) -> set[str]:
    """Every module `source` (a file of `package`) imports, by absolute name: relative imports resolved, and
    `from pkg import mod` counted as `pkg.mod` too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def imports_of(path: Path) -> set[str]:
    return imported_modules(path.read_text(), ".".join(path.relative_to(TESTS.parent).parent.parts))


def is_test_module(module: str) -> bool:
    return module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_")


def test_no_test_module_imports_another_test_module() -> None:
    offenders = {str(path.relative_to(TESTS)): sorted(m for m in imports_of(path) if is_test_module(m))
                 for path in TESTS.rglob("*.py")}
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def test_support_modules_hold_no_tests_and_import_none() -> None:
    support = sorted((TESTS / "support").rglob("*.py"))
    assert len(support) > 1, "tests/support is where the shared helpers live"
    for path in support:
        assert not path.name.startswith("test_"), path
        tests_here = [node.name for node in ast.walk(ast.parse(path.read_text()))
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")]
        assert tests_here == [], (path, tests_here)
        suites = [m for m in imports_of(path) if m.split(".")[:2] in [["tests", d] for d in SUITE_DIRS]]
        assert suites == [], (path, suites)



def test_the_check_sees_every_form_of_import() -> None:
    source = "\n".join(["from tests.unit.test_a import x", "from tests.unit import test_b", "import tests.unit.test_c",
                        "from .test_d import y", "from . import test_e", "from ..integration.test_f import z",
                        "from tests.support.wire import request"])
    found = {m for m in imported_modules(source, "tests.unit") if is_test_module(m)}
    assert found == {"tests.unit.test_a", "tests.unit.test_b", "tests.unit.test_c", "tests.unit.test_d",
                     "tests.unit.test_e", "tests.integration.test_f"}
