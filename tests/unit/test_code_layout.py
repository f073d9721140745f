"""The service's rooms and their arrows (docs/architecture.md, "Rooms"): which package may import which, and no
import circle between files beyond the ones listed here (each a place an interface could still break)."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.support.graphs import circles as graph_circles

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "coordinator", "simulator")

# package -> packages it never imports (TYPE_CHECKING imports included: they are arrows too)
NEVER_IMPORTS = {
    "protocol": ("coordinator",),
    "coordinator.timer": ("coordinator.group", "coordinator.storage"),
    "coordinator.purgatory": ("coordinator.group", "coordinator.storage"),
    "coordinator.group": ("coordinator.storage", "coordinator.telemetry", "coordinator.server", "coordinator.relay",
                          "coordinator.cluster", "coordinator.security"),
    "coordinator.storage": ("coordinator.telemetry", "coordinator.server", "coordinator.relay"),
    "coordinator.relay": ("coordinator.group",),
    "coordinator.loadgen": ("coordinator.group",),
}

# Circles between files that remain, at run time (a TYPE_CHECKING import is not one): none.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, *, type_checking: bool) -> set[str]:
    """Every module `name` imports (relative imports resolved; `from pkg import mod` counts as `pkg.mod` too),
    with or without those under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text())
    skipped = set()
    if not type_checking:
        skipped = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for node in ast.walk(block)}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (a module never imports itself here)."""
    return set(graph_circles({name: sorted(imported) for name, imported in graph.items()}))


def test_no_room_imports_what_it_must_not() -> None:
    found = modules()
    offenders = sorted(f"{name} -> {imported}" for name, path in found.items()
                       for imported in imports(name, path, type_checking=True)
                       for package, never in NEVER_IMPORTS.items() if within(name, package)
                       for forbidden in never if within(imported, forbidden))
    assert offenders == []


def test_no_import_circle_but_the_known_ones() -> None:
    found = modules()
    graph = {name: {m for m in imports(name, path, type_checking=False) if m in found and m != name}
             for name, path in found.items()}
    assert circles(graph) - KNOWN_CIRCLES == set()


def test_the_checks_see_an_arrow_and_a_circle() -> None:
    assert within("coordinator.group.shard", "coordinator.group")
    assert not within("coordinator.groups", "coordinator.group")
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset({"a", "b", "c"})}
    assert circles({"a": {"b"}, "b": set()}) == set()
