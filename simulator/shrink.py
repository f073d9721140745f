"""Shrinking a failing seed: the smallest part of its scenario that still fails the same invariant.

A seed's scenario is a list of recorded choices: the faults at their times, the consumers, the operator, Kafka's
failure rates, the wire's faults. A `Reduction` keeps part of them; the seed still drives everything else (the
random streams are per concern, so what is kept plays out as close to the original as the removals allow), and
the same seed with the same reduction replays exactly. `shrink` first switches whole concerns off (wire faults,
Kafka's failure rates, the operator), then minimises the faults and the consumers with delta debugging (Zeller's
ddmin: drop halves, quarters, ... while the failure stays), and returns the reduction with the run it gave.

    python -m simulator --seed 3 --plant zombie_guard_off --shrink
    python -m simulator --seed 3 --plant zombie_guard_off --reduce "faults=2;members=0,3;admin=0" --trace
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

from simulator.kafka import KafkaFaults

T = TypeVar("T")


@dataclass(frozen=True)
class Reduction:
    faults: tuple[int, ...] | None = None  # indices into the scenario's faults; None: all of them
    members: tuple[int, ...] | None = None  # consumer places (in the scenario's order); None: all of them
    admin: bool = True
    kafka_faults: bool = True  # Kafka's refusals, failures after append, lost acknowledgements
    wire: bool = True

    def encode(self) -> str:
        parts = []
        if self.faults is not None:
            parts.append("faults=" + ",".join(map(str, self.faults)))
        if self.members is not None:
            parts.append("members=" + ",".join(map(str, self.members)))
        parts += [f"{name}=0" for name in ("admin", "kafka_faults", "wire") if not getattr(self, name)]
        return ";".join(parts)

    @staticmethod
    def decode(text: str) -> Reduction:
        fields: dict[str, object] = {}
        for part in filter(None, text.split(";")):
            name, _, value = part.partition("=")
            if name in ("faults", "members"):
                fields[name] = tuple(int(v) for v in value.split(",") if v)
            elif name in ("admin", "kafka_faults", "wire"):
                fields[name] = value not in ("0", "false", "no")
            else:
                raise ValueError(f"unknown part of a reduction: {part!r}")
        return Reduction(**fields)  # type: ignore[arg-type]


def reduce_scenario(scenario: Any, reduction: Reduction) -> Any:
    """The scenario with only what the reduction keeps."""
    faults = scenario.faults if reduction.faults is None else [scenario.faults[i] for i in reduction.faults]
    groups = scenario.groups
    if reduction.members is not None:
        kept, place, groups = set(reduction.members), 0, []
        for group in scenario.groups:
            members = []
            for member in group.members:
                if place in kept:
                    members.append(member)
                place += 1
            groups.append(dataclasses.replace(group, members=members))
    kafka = scenario.kafka
    if not reduction.kafka_faults:
        kafka = KafkaFaults(land_ms=kafka.land_ms, ack_ms=kafka.ack_ms, delete_retention_ms=kafka.delete_retention_ms)
    return dataclasses.replace(scenario, faults=faults, groups=groups, kafka=kafka,
                               admin_every_ms=scenario.admin_every_ms if reduction.admin else None,
                               wire=scenario.wire if reduction.wire else None)


def ddmin(items: Sequence[T], fails: Callable[[list[T]], bool]) -> list[T]:
    """The classic delta debugging minimisation: a 1-minimal sublist of `items` for which `fails` holds (it
    holds for `items`)."""
    current = list(items)
    if fails([]):
        return []
    chunks_count = 2
    while len(current) >= 2:
        size = -(-len(current) // chunks_count)
        chunks = [current[i:i + size] for i in range(0, len(current), size)]
        for chunk in chunks:
            if fails(chunk):
                current, chunks_count = chunk, 2
                break
        else:
            for index in range(len(chunks)):
                complement = [x for j, chunk in enumerate(chunks) if j != index for x in chunk]
                if fails(complement):
                    current, chunks_count = complement, max(chunks_count - 1, 2)
                    break
            else:
                if chunks_count >= len(current):
                    break
                chunks_count = min(len(current), chunks_count * 2)
    if len(current) == 1 and fails([]):
        return []
    return current


def shrink(seed: int, run: Callable[[Reduction], set[str]], invariant: str, faults: int, members: int,
           progress: Callable[[str], None] = lambda line: None) -> tuple[Reduction, int]:
    """The smallest reduction found whose run still violates `invariant`, and how many runs it took. `run`
    returns the invariants a reduction's run violated."""
    runs = [0]

    def fails(reduction: Reduction) -> bool:
        runs[0] += 1
        return invariant in run(reduction)

    reduction = Reduction()
    for concern in ("wire", "kafka_faults", "admin"):
        candidate = {"wire": dataclasses.replace(reduction, wire=False),
                     "kafka_faults": dataclasses.replace(reduction, kafka_faults=False),
                     "admin": dataclasses.replace(reduction, admin=False)}[concern]
        if fails(candidate):
            reduction = candidate
            progress(f"without {concern}: still fails ({runs[0]} runs)")
    kept_faults = ddmin(range(faults), lambda kept: fails(dataclasses.replace(reduction, faults=tuple(kept))))
    reduction = dataclasses.replace(reduction, faults=tuple(kept_faults))
    progress(f"faults: {faults} -> {len(kept_faults)} ({runs[0]} runs)")
    kept_members = ddmin(range(members), lambda kept: fails(dataclasses.replace(reduction, members=tuple(kept))))
    reduction = dataclasses.replace(reduction, members=tuple(kept_members))
    progress(f"consumers: {members} -> {len(kept_members)} ({runs[0]} runs)")
    return reduction, runs[0]

