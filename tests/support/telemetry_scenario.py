"""The tracing scenario shared by the OTLP-receiver test and the Jaeger end-to-end test.

Two members join (b 700 ms after a), the group becomes Stable; b stops heartbeating while a keeps its session,
b "has failed" at its session timeout; a hears REBALANCE_IN_PROGRESS on its heartbeat, re-joins 1.5 s after the
failure, syncs 200 ms later, and the assignment's state-topic write takes 40 ms: Stable again.
Everything runs on the harness's manual clock; span timestamps are that clock mapped onto `base_ns`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from protocol.error_codes import Errors
from coordinator.group.observer import ObserverMux
from coordinator.group.state import GroupState
from coordinator.telemetry.events import EventTopicObserver
from coordinator.telemetry.otel import Telemetry
from coordinator.telemetry.service import Instrumented, instrument
from tests.support.group_harness import Client, Env, advance_until_joined, complete_rebalance, drain

START_MS = 1_000_000  # the harness clock's origin
B_LATE_MS = 700
REJOIN_AFTER_MS = 1_500
SYNC_AFTER_MS = 200
WRITE_MS = 40


class CapturedEvents:
    """The event topic's publisher interface, keeping the records (the Kafka-backed one has its own tests)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def publish(self, group_id: str, event: dict[str, Any]) -> None:
        self.records.append(event)


@dataclass
class Marks:
    """What happened when, in harness-clock milliseconds."""

    a: Client
    b: Client
    first_join_ms: int = 0
    first_stable_ms: int = 0
    failed_ms: int = 0
    rejoined_ms: int = 0
    sync_ms: int = 0
    stable_ms: int = 0
    events: CapturedEvents = field(default_factory=CapturedEvents)
    instrumented: Instrumented | None = None


def telemetry_env(telemetry: Telemetry, base_ns: int | None = None) -> tuple[Env, Instrumented, CapturedEvents]:
    env = Env()
    base = time.time_ns() if base_ns is None else base_ns
    mux = ObserverMux(env.observer)
    env.coordinator.observer = mux  # before any group exists: groups take the coordinator's observer
    instrumented = instrument(telemetry, env.coordinator, mux,
                              now_ns=lambda: base + (env.clock.now_ms() - START_MS) * 1_000_000)
    events = CapturedEvents()
    mux.add(EventTopicObserver(events, env.clock, instrumented.trace_id_for))  # type: ignore[arg-type]
    return env, instrumented, events


async def run_failure_scenario(env: Env, events: CapturedEvents) -> Marks:
    marks = Marks(env.client("a"), env.client("b"), events=events)
    a, b = marks.a, marks.b
    marks.first_join_ms = env.clock.now_ms()
    await a.start_join()
    await env.advance(B_LATE_MS, step_ms=100)
    await b.start_join()
    await advance_until_joined(env, a, b)
    await complete_rebalance(env, a, b)
    marks.first_stable_ms = env.clock.now_ms()
    assert env.state() is GroupState.STABLE

    # b goes silent; a heartbeats every 3 s. The session check runs on each 100 ms step.
    since_heartbeat = 0
    while env.state() is GroupState.STABLE:
        assert env.clock.now_ms() - marks.first_stable_ms < 20_000, "b's session never expired"
        await env.advance(100, step_ms=100)
        since_heartbeat += 100
        if since_heartbeat >= 3_000 and env.state() is GroupState.STABLE:
            assert await a.heartbeat() == Errors.NONE
            since_heartbeat = 0
    marks.failed_ms = env.clock.now_ms()
    assert env.state() is GroupState.PREPARING_REBALANCE

    await env.advance(REJOIN_AFTER_MS - 500, step_ms=100)
    assert await a.heartbeat() == Errors.REBALANCE_IN_PROGRESS
    await env.advance(500, step_ms=100)
    marks.rejoined_ms = env.clock.now_ms()
    await a.start_join()
    assert a.join_task is not None and a.join_task.done(), "a alone should complete the join at once"
    assert a.take_join().error_code == Errors.NONE

    await env.advance(SYNC_AFTER_MS, step_ms=100)
    marks.sync_ms = env.clock.now_ms()
    gate = env.store.hold_next_write()
    await a.start_sync({a.member_id: b"assignment-a"})
    await env.advance(WRITE_MS, step_ms=WRITE_MS)
    gate.set()
    await drain()
    assert a.sync_task is not None and a.sync_task.result().error_code == Errors.NONE
    marks.stable_ms = env.clock.now_ms()
    assert env.state() is GroupState.STABLE
    return marks


def ms_to_ns(base_ns: int, ms: int) -> int:
    return base_ns + (ms - START_MS) * 1_000_000
