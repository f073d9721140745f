"""Graph helpers for tests that look for circles: module imports (test_code_layout.py) and reference cycles
among the objects a collection found unreachable (`unreachable_cycles`: test_conversion_replacement_hold.py,
test_failed_append_cycles.py)."""

from __future__ import annotations

import gc

from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

Node = TypeVar("Node", bound=Hashable)


def circles(graph: Mapping[Node, Iterable[Node]]) -> list[frozenset[Node]]:
    """The strongly connected components that are circles: more than one node, or one node with an edge to
    itself (Tarjan, iteratively; every edge's target must be a node of `graph`)."""
    edges = {node: list(targets) for node, targets in graph.items()}
    index: dict[Node, int] = {}
    low: dict[Node, int] = {}
    stack: list[Node] = []
    on_stack: set[Node] = set()
    found: list[frozenset[Node]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if child < len(edges[node]):
                work.append((node, child + 1))
                nxt = edges[node][child]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    found.append(frozenset(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def unreachable_cycles() -> list[list[object]]:
    """The reference cycles a full collection would free now, each as its objects (the collector's debug mode
    keeps them in gc.garbage for the look, then lets them go)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        garbage = list(gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
    index = {id(o): n for n, o in enumerate(garbage)}
    edges = [[index[id(r)] for r in gc.get_referents(o) if id(r) in index] for o in garbage]
    return [[garbage[n] for n in c] for c in circles(dict(enumerate(edges)))]
