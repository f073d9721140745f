"""The event topic tells one rebalance story as docs/state-topic.md documents it, read back with a real consumer:
two members join and sync, one stops heartbeating and fails with a reason, the group rebalances to the survivor."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from coordinator.embedded import EmbeddedKafka
from coordinator.storage.config import DEFAULT_EVENT_DELIVERY_TIMEOUT_MS
from protocol.apis import ApiKey
from tests.support.event_topic import read_events
from tests.support.service import REBALANCE_IN_PROGRESS, service, unique, until_loaded
from tests.support.wire import heartbeat, join, join_with_member_id, nested, request, sync

GROUP = "events-app"
SHORT_SESSION_MS = 2_000
LONG_SESSION_MS = 20_000
INITIAL_DELAY_MS = 2_000  # both members join within it, even on a loaded machine (Kafka extends it per join)
ANSWERED_WITHIN_S = 10
EXPIRY_NOTICED_WITHIN_S = 60  # past the session: only keeps a broken expiry from hanging the test (load-proof)
READ_BACK_WITHIN_S = 120  # a fresh reader's group join and fetch on a loaded machine: waits for the event, bounded
DOCUMENTED_FIELDS = {
    "state_change": {"old_state", "new_state", "generation"},
    "member_joined": {"member_id", "group_instance_id", "client_id", "client_host", "principal", "security_protocol"},
    "member_failed": {"member_id", "group_instance_id", "reason"},
    "rebalance_started": {"generation", "reason", "cause_category"},
    "rebalance_completed": {"generation", "member_count", "duration_ms"},
}
COMMON_FIELDS = {"version", "type", "group_id", "ts_ms"}


def story(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The events with their ids and timings left out."""
    summary = []
    for event in events:
        kind = event["type"]
        if kind == "state_change":
            summary.append((kind, event["old_state"], event["new_state"], event["generation"]))
        elif kind in ("rebalance_started", "rebalance_completed"):
            summary.append((kind, event["generation"]) + ((event["member_count"],) if "member_count" in event else ()))
        else:
            summary.append((kind, event["member_id"]))
    return summary


async def test_event_topic_tells_a_rebalance_story(kafka_bootstrap: str) -> None:
    event_topic = unique("__events")
    settings = (f"group.initial.rebalance.delay.ms={INITIAL_DELAY_MS}", "group.min.session.timeout.ms=1000")
    async with service(kafka_bootstrap, unique("__state"), *settings, event_topic=event_topic) as running:
        a, b = await running.client(), await running.client()
        await until_loaded(a, GROUP)
        joined = await asyncio.gather(join_with_member_id(a, GROUP, session_timeout_ms=LONG_SESSION_MS),
                                      join_with_member_id(b, GROUP, session_timeout_ms=SHORT_SESSION_MS))
        a_id, b_id = joined[0].member_id, joined[1].member_id
        generation = joined[0].generation_id
        leader = joined[0].leader
        clients = {a_id: a, b_id: b}
        synced = await asyncio.gather(*(sync(clients[m], GROUP, generation, m,
                                             {a_id: b"A", b_id: b"B"} if m == leader else None) for m in clients))
        assert [s.error_code for s in synced] == [0, 0]

        # b goes silent; a heartbeats (as a real member would) until told to rejoin, then rejoins alone and syncs
        deadline = time.monotonic() + SHORT_SESSION_MS / 1000 + EXPIRY_NOTICED_WITHIN_S
        while (await a.request(heartbeat(GROUP, generation, a_id))).error_code != REBALANCE_IN_PROGRESS:
            assert time.monotonic() < deadline, "b's session never expired"
            await asyncio.sleep(0.2)
        told_to_rejoin_ms = time.time() * 1000
        rejoined = await join(a, GROUP, a_id, session_timeout_ms=LONG_SESSION_MS)
        assert rejoined.error_code == 0 and [m.member_id for m in rejoined.members] == [a_id]
        assert (await sync(a, GROUP, rejoined.generation_id, a_id, {a_id: b"A"})).error_code == 0

        def complete(events: list[dict[str, Any]]) -> bool:
            return any(e["type"] == "rebalance_completed" and e["generation"] == rejoined.generation_id
                       for e in events)

        events = await asyncio.to_thread(read_events, kafka_bootstrap, event_topic, GROUP, complete)
        for client in (a, b):
            await client.close()
        assert await running.terminate() == 0

    assert complete(events), story(events)
    for event in events:
        assert set(event) - {"trace_id"} == COMMON_FIELDS | DOCUMENTED_FIELDS[event["type"]], event
        assert event["version"] == 1
    assert [e["ts_ms"] for e in events] == sorted(e["ts_ms"] for e in events)
    assert abs(events[0]["ts_ms"] / 1000 - time.time()) < 120  # wall-clock epoch ms, not the monotonic clock

    joined_events = [e for e in events if e["type"] == "member_joined"]
    assert sorted(e["member_id"] for e in joined_events) == sorted((a_id, b_id))
    assert {(e["client_id"], e["client_host"], e["group_instance_id"]) for e in joined_events} == {
        ("e2e-test", "/127.0.0.1", None)}
    first_completing = next(i for i, e in enumerate(events) if e.get("new_state") == "CompletingRebalance")
    assert all(events.index(e) < first_completing for e in joined_events)

    names = {a_id: "a", b_id: "b"}
    rest = [(kind, *(names.get(x, x) for x in fields)) for kind, *fields in story(events) if kind != "member_joined"]
    assert rest == [
        ("state_change", "Empty", "PreparingRebalance", 0),
        ("rebalance_started", 0),
        ("state_change", "PreparingRebalance", "CompletingRebalance", 1),
        ("state_change", "CompletingRebalance", "Stable", 1),
        ("rebalance_completed", 1, 2),
        ("member_failed", "b"),
        ("state_change", "Stable", "PreparingRebalance", 1),
        ("rebalance_started", 1),
        ("state_change", "PreparingRebalance", "CompletingRebalance", 2),
        ("state_change", "CompletingRebalance", "Stable", 2),
        ("rebalance_completed", 2, 1),
    ], rest

    by_type: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_type.setdefault(event["type"], []).append(event)
    failed = by_type["member_failed"][0]
    assert "session" in failed["reason"], failed
    assert b_id in by_type["rebalance_started"][1]["reason"]
    # Kafka's promise: never before the session timeout since b's last heartbeat (its sync, when the group became
    # Stable); how late depends on the machine, so the only upper bound is the order of things: b had failed
    # before a heard of the rebalance b's failure started
    stable_1 = next(e for e in events if e.get("new_state") == "Stable")
    assert failed["ts_ms"] - stable_1["ts_ms"] >= SHORT_SESSION_MS - 100, (failed, stable_1)
    assert failed["ts_ms"] <= told_to_rejoin_ms + 1, (failed, told_to_rejoin_ms)
    for started, completed in zip(by_type["rebalance_started"], by_type["rebalance_completed"]):
        assert abs(completed["duration_ms"] - (completed["ts_ms"] - started["ts_ms"])) <= 50, (started, completed)
    assert by_type["rebalance_completed"][0]["duration_ms"] >= INITIAL_DELAY_MS


async def test_events_of_a_short_broker_outage_arrive_once_it_is_back(restartable_kafka: EmbeddedKafka) -> None:
    """Events are fire-and-forget, but an outage shorter than the event producer's message timeout (30 s) loses
    nothing: they wait in the producer's queue, and group operations never wait for them.

    The outage is the broker's JVM stopped (SIGSTOP) and continued: its length is the test's to choose, however
    loaded the machine (a restart of the JVM could itself take longer than the message timeout here)."""
    event_topic = unique("__events")
    settings = ("group.initial.rebalance.delay.ms=0", "group.min.session.timeout.ms=1000")
    async with service(restartable_kafka.bootstrap, unique("__state"), *settings, event_topic=event_topic) as running:
        client = await running.client()
        await until_loaded(client, GROUP)
        broker_pid = restartable_kafka.pid
        assert broker_pid is not None
        os.kill(broker_pid, signal.SIGSTOP)
        started = time.monotonic()
        try:
            # no group operation waits for events: answered while Kafka does not answer (so nothing could be
            # delivered), and well within the producer's message timeout (a loaded machine: not 2 s)
            joined = await join_with_member_id(client, GROUP, session_timeout_ms=LONG_SESSION_MS)
            assert joined.error_code == 0 and time.monotonic() - started < ANSWERED_WITHIN_S
            left = await client.request(request(ApiKey.LEAVE_GROUP, 5, group_id=GROUP, members=(
                nested(ApiKey.LEAVE_GROUP, 5, "members")(member_id=joined.member_id, group_instance_id=None,
                                                         reason="bye"),)))
            assert left.error_code == 0
        finally:
            os.kill(broker_pid, signal.SIGCONT)
        outage_s = time.monotonic() - started
        # both answered within ANSWERED_WITHIN_S each: the events cannot have been held past the timeout
        assert outage_s < DEFAULT_EVENT_DELIVERY_TIMEOUT_MS / 1000, f"outage of {outage_s:.1f}s: past the timeout"

        def left_seen(events: list[dict[str, Any]]) -> bool:
            return any(e["type"] == "member_left" for e in events)

        events = await asyncio.to_thread(read_events, restartable_kafka.bootstrap, event_topic, GROUP, left_seen,
                                         READ_BACK_WITHIN_S)
        await client.close()
        assert await running.terminate() == 0
    assert [e["type"] for e in events if e["type"] in ("member_joined", "member_left")] == [
        "member_joined", "member_left"], (f"outage {outage_s:.1f}s", story(events))
    member_left = next(e for e in events if e["type"] == "member_left")
    assert member_left["member_id"] == joined.member_id and "bye" in member_left["reason"], member_left
