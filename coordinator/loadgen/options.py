"""What `coordinator simulate` is asked to do: the population, its timings, and the failures to inject."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import coordinator.loadgen.assignors as assignors

if TYPE_CHECKING:
    from coordinator.security.clusters import ClusterSecurity

FAILURE_KINDS = ("crash", "hang", "slow", "leave", "static-restart")


@dataclass(frozen=True)
class ScheduledFailure:
    kind: str
    count: int
    at_s: float

    @classmethod
    def parse(cls, text: str) -> ScheduledFailure:
        """KIND[:COUNT]@SECONDS, e.g. hang:3@5 (three members hang 5 s after the start)."""
        head, sep, at = text.partition("@")
        kind, _, count = head.partition(":")
        if not sep or kind not in FAILURE_KINDS:
            raise ValueError(f"expected KIND[:COUNT]@SECONDS with KIND in {', '.join(FAILURE_KINDS)}, got {text!r}")
        return cls(kind, int(count or 1), float(at))


@dataclass(frozen=True)
class SimOptions:
    coordinator: tuple[str, int]  # where FindCoordinator goes first
    more_coordinators: tuple[tuple[str, int], ...] = ()  # other instances to ask when it does not answer
    bootstrap_server: str | None = None  # Kafka admin (topic creation); None: the topic must exist
    groups: int = 10
    members: int = 3
    topic: str = "simulated"
    partitions: int = 12
    group_prefix: str = "sim"
    assignor: str = assignors.RANGE
    static: bool = False
    session_ms: int = 10_000
    rebalance_ms: int = 30_000
    heartbeat_ms: int = 3_000
    commit_interval_ms: int = 5_000
    records_per_commit: int = 100
    request_timeout_ms: int = 30_000
    client_id: str = "coordinator-simulate"
    duration_s: float = 30.0
    settle_timeout_s: float = 60.0
    schedule: tuple[ScheduledFailure, ...] = ()
    failure_rate_per_min: float = 0.0  # random failures, per minute, across the population
    failure_kinds: tuple[str, ...] = ("crash", "hang")
    downtime_ms: int | None = None  # how long a crashed/hung member stays away (default session + 3 s)
    seed: int | None = None
    event_topic: str | None = None  # the coordinator's event topic: exact expiry times (our coordinator only)
    leave_on_exit: bool = True
    named_groups: tuple[str, ...] = ()  # explicit group ids instead of PREFIX-NNNN (then `groups` is ignored)
    max_connecting: int = 64  # connects in flight: more overflows a default listen backlog (SYNs dropped)
    real: int = 0  # real consumers (confluent-kafka, aiokafka) reading the topic through the coordinator's relay
    # TLS and SASL of every client of the simulation (members, topic admin, event reader, real clients): a
    # secured cluster and a coordinator whose SASL listener passes the exchange through to it. None: PLAINTEXT
    security: ClusterSecurity | None = None

    @property
    def discovery_addresses(self) -> tuple[tuple[str, int], ...]:
        return (self.coordinator, *self.more_coordinators)

    @property
    def bootstrap_text(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.discovery_addresses)

    @property
    def failure_downtime_ms(self) -> int:
        return self.downtime_ms if self.downtime_ms is not None else self.session_ms + 3_000

    def group_ids(self) -> list[str]:
        if self.named_groups:
            return list(self.named_groups)
        return [f"{self.group_prefix}-{index:04d}" for index in range(self.groups)]
