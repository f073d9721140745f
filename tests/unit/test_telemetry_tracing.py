"""Rebalance traces received by a real OTLP/HTTP receiver (decoded with opentelemetry-proto): the span tree,
phase order and durations against the scenario's manual clock, events, attributes, links, and the event topic's
trace ids. Metrics: the Prometheus endpoint's rebalance and expiry counters move in the same scenario."""

from __future__ import annotations

import asyncio
import threading
import logging
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

from coordinator.telemetry.otel import start_telemetry
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.support.telemetry_scenario import (B_LATE_MS, WRITE_MS, ms_to_ns, run_failure_scenario, telemetry_env)
from protocol.error_codes import Errors
from tests.support.group_harness import SESSION_MS, advance_until_joined, complete_rebalance, form_group

GROUP = "messaging.consumer.group.name"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> dict[str, ReceivedSpan]:
    return {s.name: s for s in spans if s.parent_span_id == parent.span_id}


def roots(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return sorted((s for s in spans if s.name == "rebalance" and not s.parent_span_id), key=lambda s: s.start_ns)


async def test_a_failed_member_rebalance_is_one_trace(receiver: OtlpReceiver,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="coordinator")
    telemetry = start_telemetry(env={}, trace_exporter=OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces"))
    base = time.time_ns()
    env, instrumented, events = telemetry_env(telemetry, base)
    try:
        marks = await run_failure_scenario(env, events)
    finally:
        await env.close()
        instrumented.uninstall()
        telemetry.shutdown()  # flushes the batch processor
    a, b = marks.a, marks.b
    spans = receiver.wait_for(lambda spans: len(roots(spans)) == 2)
    assert {s.service_name for s in spans} == {"coordinator"}
    first, second = roots(spans)

    # --- the rebalance caused by b's failure ------------------------------------------------------------
    tree = receiver.trace(second.trace_id)
    assert {s.trace_id for s in tree} == {second.trace_id}
    phases = children(tree, second)
    assert set(phases) == {"join phase", "sync phase"}
    join, sync = phases["join phase"], phases["sync phase"]
    assert set(children(tree, join)) == {f"JoinGroup wait {a.member_id}"}
    sync_children = children(tree, sync)
    assert set(sync_children) == {f"SyncGroup wait {a.member_id}", "state-topic write"}

    at = lambda ms: ms_to_ns(base, ms)  # noqa: E731
    assert second.start_ns == join.start_ns == at(marks.failed_ms)
    assert join.end_ns == sync.start_ns == at(marks.rejoined_ms)
    assert sync.end_ns == second.end_ns == at(marks.stable_ms)
    assert join.duration_ms == marks.rejoined_ms - marks.failed_ms == 1_500
    assert sync.duration_ms == marks.stable_ms - marks.rejoined_ms == 200 + WRITE_MS
    write = sync_children["state-topic write"]
    assert write.duration_ms == WRITE_MS and write.start_ns == at(marks.sync_ms)
    assert write.status_code == 1 and write.attributes["coordinator.error"] == "NONE"
    a_sync = sync_children[f"SyncGroup wait {a.member_id}"]
    assert (a_sync.start_ns, a_sync.end_ns) == (at(marks.sync_ms), at(marks.stable_ms))
    a_join = children(tree, join)[f"JoinGroup wait {a.member_id}"]
    assert a_join.start_ns == a_join.end_ns == at(marks.rejoined_ms)  # a came last, 1.5 s into the phase
    assert a_join.attributes["coordinator.member.last_to_join"] is True
    assert a_join.attributes["messaging.client.id"] == "a"

    failed = second.event("member failed")
    assert failed[1] == at(marks.failed_ms)
    assert failed[2] == {
        "message": f"Member {b.member_id} in group g has failed, removing it from the group",
        "coordinator.member.id": b.member_id, "coordinator.reason": "session timeout",
        "messaging.client.id": "b", "client.address": "/127.0.0.1",
        "coordinator.session_timeout_ms": SESSION_MS,
        "coordinator.since_last_heartbeat_ms": marks.failed_ms - marks.first_stable_ms,
    }
    busy = second.event("REBALANCE_IN_PROGRESS")
    assert busy[2] == {"coordinator.api": "Heartbeat", "coordinator.member.id": a.member_id}
    transitions = [(e[2]["from"], e[2]["to"]) for e in second.events if e[0] == "state change"]
    assert transitions == [("Stable", "PreparingRebalance"), ("PreparingRebalance", "CompletingRebalance"),
                           ("CompletingRebalance", "Stable")]
    assert second.attributes["messaging.system"] == "kafka" and second.attributes[GROUP] == "g"
    assert second.attributes["coordinator.rebalance.reason_category"] == "session_timeout"
    assert second.attributes["coordinator.generation.previous"] == 1
    assert second.attributes["coordinator.generation"] == 2
    assert second.attributes["coordinator.protocol.name"] == "range"
    assert second.attributes["coordinator.member_count"] == 1
    assert second.attributes["coordinator.leader.id"] == a.member_id
    assert second.attributes["coordinator.rebalance.duration_ms"] == marks.stable_ms - marks.failed_ms
    assert second.status_code == 1
    assert [(link[0], link[2]) for link in second.links] == [
        (first.trace_id, {"coordinator.link": "previous rebalance"})]

    # --- the group's first rebalance: who arrived when, who was last ---------------------------------------
    first_tree = receiver.trace(first.trace_id)
    first_join = children(first_tree, first)["join phase"]
    waits = children(first_tree, first_join)
    a_wait, b_wait = waits[f"JoinGroup wait {a.member_id}"], waits[f"JoinGroup wait {b.member_id}"]
    assert a_wait.start_ns == at(marks.first_join_ms) == first.start_ns
    assert b_wait.start_ns == at(marks.first_join_ms + B_LATE_MS)
    assert a_wait.end_ns == b_wait.end_ns == first_join.end_ns
    assert first_join.attributes["coordinator.join.last_member"] == b.member_id
    assert [e[0] for e in first.events][:2] == ["member joined", "state change"]
    assert first.attributes["coordinator.rebalance.reason_category"] == "member_joined"

    # --- the event topic's records carry their rebalance's trace id ----------------------------------------
    by_type = {}
    for record in events.records:
        by_type.setdefault(record["type"], []).append(record)
    assert by_type["member_failed"][0]["trace_id"] == second.trace_id  # the rebalance it causes
    assert [r["trace_id"] for r in by_type["rebalance_started"]] == [first.trace_id, second.trace_id]
    assert [r["trace_id"] for r in by_type["rebalance_completed"]] == [first.trace_id, second.trace_id]

    # --- log lines: the rebalance's lines carry its trace id; the failure line stays exactly Kafka's ------------
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("event=rebalance_prepare group=g generation=1 ")
               and line.endswith(f" trace_id={second.trace_id}") for line in lines), lines
    assert f"Member {b.member_id} in group g has failed, removing it from the group" in lines
    assert any(line.startswith("event=rebalance_complete group=g generation=2 ")
               and line.endswith(f" trace_id={second.trace_id}") for line in lines), lines


async def test_superseded_rebalance_ends_in_error_and_links_to_the_next(receiver: OtlpReceiver) -> None:
    telemetry = start_telemetry(env={}, trace_exporter=OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces"))
    env, instrumented, events = telemetry_env(telemetry)
    try:
        a, b = env.client("a"), env.client("b")
        await a.start_join()
        await b.start_join()
        await advance_until_joined(env, a, b)
        a.take_join(), b.take_join()
        follower = b if a.is_leader else a
        await follower.start_sync()  # parked: the leader has not sent the assignment
        c = env.client("c")
        await c.start_join()  # a new member during CompletingRebalance: this generation is over
    finally:
        await env.close()
        instrumented.uninstall()
        telemetry.shutdown()
    spans = receiver.wait_for(lambda spans: len(roots(spans)) >= 2)
    first, second = roots(spans)[:2]
    assert first.status_code == 2 and first.status_message == "superseded by a new rebalance"
    assert first.attributes["coordinator.rebalance.outcome"] == "superseded"
    assert (first.trace_id, {"coordinator.link": "superseded rebalance"}) in [(l[0], l[2]) for l in second.links]
    sync = children(receiver.trace(first.trace_id), first)["sync phase"]
    assert sync.end_ns == first.end_ns == second.start_ns


async def test_prometheus_endpoint_counts_rebalances_and_expirations() -> None:
    telemetry = start_telemetry(env={}, metrics_listen=("127.0.0.1", 0))
    assert telemetry.tracer_provider is None and telemetry.metrics_address is not None
    host, port = telemetry.metrics_address
    env, instrumented, events = telemetry_env(telemetry)

    def scrape() -> list[tuple[str, dict[str, str], float]]:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
                for s in family.samples]

    def value(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
        """The sum of `name`'s samples whose labels include `labels` (the exporter adds otel_scope_*)."""
        matching = [v for n, got, v in samples if n == name and labels.items() <= got.items()]
        assert matching, f"no sample {name}{labels}"
        return sum(matching)

    try:
        before = await asyncio.to_thread(scrape)  # the loop answers the census meanwhile
        assert value(before, "coordinator_groups", state="Stable") == 0
        marks = await run_failure_scenario(env, events)
        after = await asyncio.to_thread(scrape)
    finally:
        await env.close()
        instrumented.uninstall()
        telemetry.shutdown()
    assert marks.stable_ms > marks.failed_ms
    assert value(after, "coordinator_rebalances_total", reason="member_joined") == 1
    assert value(after, "coordinator_rebalances_total", reason="session_timeout") == 1
    assert value(after, "coordinator_session_expirations_total") == 1
    assert value(after, "coordinator_member_failures_total", reason="session timeout") == 1
    assert value(after, "coordinator_groups", state="Stable") == 1
    assert value(after, "coordinator_members") == 1
    assert value(after, "coordinator_heartbeats_total") >= 2
    assert value(after, "coordinator_rebalance_duration_milliseconds_count", outcome="stable") == 2
    assert value(after, "coordinator_rebalance_duration_milliseconds_sum") == (
        marks.stable_ms - marks.failed_ms) + (marks.first_stable_ms - marks.first_join_ms)
    assert value(after, "coordinator_state_topic_append_duration_milliseconds_count", record="group") >= 2
    # a's live session is watched (a completed operation counts until the purge removes it, as in Kafka)
    assert value(after, "coordinator_purgatory_watched", purgatory="Heartbeat") >= 1


async def test_other_group_requests_are_spans_linked_to_the_rebalance(receiver: OtlpReceiver) -> None:
    from coordinator.group import api

    telemetry = start_telemetry(env={}, trace_exporter=OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces"))
    env, instrumented, _events = telemetry_env(telemetry)
    # through the runtime's declared hook, none of its methods replaced on the instance (a compiled runtime's
    # methods are read-only)
    assert env.coordinator.request_spans is not None
    # (a compiled instance has no __dict__ at all: nothing can have been put there)
    replaced = set(getattr(env.coordinator, "__dict__", ()))
    assert not {"leave_group", "commit_offsets", "describe_groups", "delete_groups"} & replaced
    try:
        a, b = env.client("a"), env.client("b")
        await form_group(env, a, b)
        committed = await env.coordinator.commit_offsets(api.OffsetCommitRequest(
            "g", a.generation, a.member_id, [api.OffsetCommitRequestTopic("t", [
                api.OffsetCommitRequestPartition(0, 42)])]))
        assert committed.topics[0].partitions[0].error_code.name == "NONE"
        stale = await env.coordinator.commit_offsets(api.OffsetCommitRequest(
            "g", a.generation + 5, a.member_id, [api.OffsetCommitRequestTopic("t", [
                api.OffsetCommitRequestPartition(0, 43)])]))
        assert stale.topics[0].partitions[0].error_code.name == "ILLEGAL_GENERATION"
        await env.coordinator.describe_groups(api.DescribeGroupsRequest(["g"]))
        assert await b.leave() == Errors.NONE
    finally:
        await env.close()
        instrumented.uninstall()
        telemetry.shutdown()
    spans = receiver.wait_for(lambda spans: any(s.name == "LeaveGroup" for s in spans))
    rebalance = roots(spans)[0]
    requests = {s.name: s for s in spans if s.name in ("OffsetCommit", "DescribeGroups", "LeaveGroup")}
    assert set(requests) == {"OffsetCommit", "DescribeGroups", "LeaveGroup"}
    commits = [s for s in spans if s.name == "OffsetCommit"]
    assert [s.status_code for s in commits] == [0, 2]
    assert commits[1].attributes["coordinator.error"] == "ILLEGAL_GENERATION"
    for span in requests.values():
        assert span.kind == 2 and not span.parent_span_id  # SERVER, a trace of its own
        assert span.trace_id != rebalance.trace_id
        assert [(link[0], link[1]) for link in span.links] == [(rebalance.trace_id, rebalance.span_id)]
        assert span.attributes[GROUP] == "g"
    assert requests["LeaveGroup"].attributes["coordinator.member.id"] == b.member_id
    assert commits[0].attributes["coordinator.member.id"] == a.member_id
    # the leave started the next rebalance: a trace of its own, linked to the first and to the LeaveGroup
    assert len(roots(spans)) == 2
    assert [(link[0], link[2]["coordinator.link"]) for link in roots(spans)[1].links] == [
        (rebalance.trace_id, "previous rebalance"), (requests["LeaveGroup"].trace_id, "request that started it")]


async def test_group_census_of_many_groups_runs_on_the_loop_in_slices() -> None:
    from coordinator.group.metadata import GroupMetadata
    from coordinator.group.observer import GroupObserver
    from coordinator.group.state import GroupState
    from coordinator.telemetry.metrics import GroupCensus

    class Coordinator:
        groups = {f"g{i}": GroupMetadata(f"g{i}", GroupState.STABLE if i % 2 else GroupState.EMPTY, 0,
                                         GroupObserver()) for i in range(50)}

    census = GroupCensus(Coordinator(), direct_limit=10, slice_size=7)
    assert census.read() == ({}, 0)  # above the limit: the first read starts a scan on the loop
    for _ in range(20):
        await asyncio.sleep(0)
    assert census.read() == ({"Stable": 25, "Empty": 25}, 0)
    small = GroupCensus(Coordinator(), direct_limit=100)
    assert small.read() == ({"Stable": 25, "Empty": 25}, 0)  # counted on the spot

    # From the collector's thread: counted by the loop, never by walking the groups on that thread.
    class Watched(dict):  # type: ignore[type-arg]
        def values(self):  # type: ignore[no-untyped-def]
            walkers.append(threading.get_ident())
            return super().values()

    walkers: list[int] = []
    Coordinator.groups = Watched(Coordinator.groups)
    from_thread = await asyncio.to_thread(small.read)
    assert from_thread == ({"Stable": 25, "Empty": 25}, 0) and set(walkers) == {threading.get_ident()}


async def test_a_member_removed_for_not_rejoining_is_described_in_its_failure_event(receiver: OtlpReceiver) -> None:
    """Removed by the coordinator without a session expiry (it kept heartbeating but never rejoined): its trace
    event still says which client and host it was, like a session expiry's."""
    telemetry = start_telemetry(env={}, trace_exporter=OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces"))
    env, instrumented, _ = telemetry_env(telemetry)
    try:
        # sessions longer than the rebalance timeout: the join phase's end, not a session, removes b
        a, b = (env.client(name, session_timeout_ms=60_000, rebalance_timeout_ms=5_000) for name in "ab")
        await form_group(env, a, b)
        c = env.client("c", session_timeout_ms=60_000, rebalance_timeout_ms=5_000)
        await c.start_join()  # a rebalance; a rejoins, b only heartbeats
        await a.start_join()
        assert await b.heartbeat() == Errors.REBALANCE_IN_PROGRESS
        await advance_until_joined(env, a, c)
        assert b.member_id not in env.group().members
        await complete_rebalance(env, a, c)
    finally:
        await env.close()
        instrumented.uninstall()
        telemetry.shutdown()
    spans = receiver.wait_for(lambda spans: len(roots(spans)) == 2)
    failed = roots(spans)[1].event("member failed")
    assert failed[2] == {
        "message": f"Member {b.member_id} in group g has failed, removing it from the group",
        "coordinator.member.id": b.member_id, "coordinator.reason": "not rejoined before rebalance timeout",
        "messaging.client.id": "b", "client.address": "/127.0.0.1", "coordinator.session_timeout_ms": 60_000,
    }
