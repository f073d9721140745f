"""What the simulation observed: error codes per API, rebalances per group (client-side view), injected failures
and their detection. One process, one event loop: plain counters, no locks."""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from protocol.error_codes import Errors

# answers a well-behaved member gets in normal operation, per API
EXPECTED = {
    "FindCoordinator": {Errors.NONE},
    "JoinGroup": {Errors.NONE, Errors.MEMBER_ID_REQUIRED},
    "SyncGroup": {Errors.NONE, Errors.REBALANCE_IN_PROGRESS},
    "Heartbeat": {Errors.NONE, Errors.REBALANCE_IN_PROGRESS},
    "OffsetCommit": {Errors.NONE, Errors.REBALANCE_IN_PROGRESS},
    "LeaveGroup": {Errors.NONE},
}
# answers a real client handles without a fault of its own: the coordinator moved, restarted or is loading
TOLERATED = {Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR,
             Errors.REQUEST_TIMED_OUT}


def error_name(code: int) -> str:
    """Kafka's name of any error code (kio knows all of them; Errors only those the coordinator answers with)."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR_{code}"


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def summary_of(values: list[float]) -> dict[str, float | int | None]:
    return {"count": len(values), "p50": percentile(values, 0.50), "p99": percentile(values, 0.99),
            "max": max(values) if values else None}


@dataclass
class Failure:
    """One injected failure of one member."""

    kind: str
    group_id: str
    member_key: str  # "<group>/<index>": stable across the member's ids
    member_id: str
    instance_id: str | None
    generation: int
    injected_at: float  # wall clock, s
    last_heartbeat_ms: int | None  # wall clock of the member's last heartbeat sent before the failure
    expect_detection: bool
    detected: int = 0  # UNKNOWN_MEMBER_ID answers to the member's probe after it came back
    probe_code: int | None = None
    expired_at_ms: list[int] = field(default_factory=list)  # the coordinator's member_failed events

    def lateness_ms(self, session_ms: int) -> float | None:
        if not self.expired_at_ms or self.last_heartbeat_ms is None:
            return None
        return self.expired_at_ms[0] - self.last_heartbeat_ms - session_ms


@dataclass
class Rebalance:
    group_id: str
    generation: int
    reason: str
    members: int
    duration_ms: float


class GroupRounds:
    """The client-side view of one group's rebalances: a round opens when the first member starts (re)joining
    and closes when the last member of the new generation has its SyncGroup answered."""

    __slots__ = ("group_id", "opened_at", "reason", "opener", "expected", "synced", "completed_generation")

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.opened_at: float | None = None
        self.reason = ""
        self.opener = ""
        self.expected: dict[int, int] = {}
        self.synced: collections.Counter[int] = collections.Counter()
        self.completed_generation = -1

    def joining(self, member_key: str, reason: str) -> None:
        if self.opened_at is None:
            self.opened_at, self.reason, self.opener = time.monotonic(), reason, member_key

    def leader_joined(self, generation: int, members: int) -> None:
        self.expected[generation] = members

    def synced_generation(self, member_key: str, generation: int) -> Rebalance | None:
        if generation <= self.completed_generation:
            if member_key == self.opener:  # answered from the current generation: no rebalance happened
                self.opened_at = None
            return None
        self.synced[generation] += 1
        expected = self.expected.get(generation)
        if expected is None or self.synced[generation] < expected:
            return None
        opened = self.opened_at if self.opened_at is not None else time.monotonic()
        done = Rebalance(self.group_id, generation, self.reason or "unknown", expected,
                         (time.monotonic() - opened) * 1000)
        self.completed_generation = generation
        self.opened_at = None
        for old in [g for g in self.expected if g <= generation]:
            del self.expected[old]
            self.synced.pop(old, None)
        return done

    @property
    def in_flight(self) -> bool:
        return self.opened_at is not None


class Stats:
    def __init__(self) -> None:
        self.errors: collections.Counter[tuple[str, int]] = collections.Counter()
        self.unexpected: collections.Counter[tuple[str, int]] = collections.Counter()
        self.rebalances: list[Rebalance] = []
        self.failures: list[Failure] = []
        self.connection_errors = 0
        self.heartbeats = 0
        self.commits = 0

    def record(self, api: str, code: int, expected: bool = False) -> None:
        self.errors[(api, code)] += 1
        if not expected and code not in EXPECTED.get(api, {Errors.NONE}) and code not in TOLERATED:
            self.unexpected[(api, code)] += 1
