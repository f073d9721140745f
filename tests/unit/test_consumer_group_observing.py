"""What a consumer group's life tells the observers (coordinator/group/modern/observing.py) and the trace the
consumer rebalance tracer makes of it, through the runtime on a manual clock: joins, revocation before
assignment, a fenced member with Kafka 4.1's line, a superseded bump, and the bound on a 1,000-member group."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from coordinator.group.observer import GroupObserver, ObserverMux
from coordinator.group.runtime import GroupRuntime
from coordinator.telemetry.consumer_tracing import MAX_MEMBER_SPANS, ConsumerRebalanceTracer
from coordinator.topics import StaticTopics, TopicImage
from tests.support.consumer_group_env import FOO, GROUP, SESSION_MS, Env


class Recorder(GroupObserver):
    """Every consumer-group callback, in order, as (name, interesting fields)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("on_consumer_"):
            return lambda *args: self.calls.append((name.removeprefix("on_consumer_"), args[1:]))
        return super().__getattribute__(name)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def take(self) -> list[tuple[str, Any]]:
        calls, self.calls = self.calls, []
        return calls


@pytest.fixture
async def traced():  # type: ignore[no-untyped-def]
    env = Env()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    recorder = Recorder()
    tracer = ConsumerRebalanceTracer(provider.get_tracer("test"), lambda: env.clock.now_ms() * 1_000_000)
    env.runtime.observer = ObserverMux(recorder, tracer)
    yield env, recorder, tracer, exporter
    await env.runtime.shutdown()
    await env.timer.close()


def roots(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == "rebalance"]


def latest(exporter: InMemorySpanExporter, group_epoch: int) -> list[ReadableSpan]:
    return [r for r in roots(exporter) if r.attributes["coordinator.group_epoch"] == group_epoch]


def children(exporter: InMemorySpanExporter, root: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.parent is not None
            and s.parent.span_id == root.context.span_id]


async def test_a_join_then_a_second_member_revoking_first(traced, caplog) -> None:  # type: ignore[no-untyped-def]
    env, recorder, tracer, exporter = traced
    with caplog.at_level(logging.INFO, "coordinator.group"):
        a = await env.heartbeat("a", 0)
    group = env.group()
    assert f"[GroupId g] Bumped group epoch to 1 with metadata hash {group.metadata_hash}." in caplog.messages
    assert any(m.startswith("[GroupId g] Computed a new target assignment for epoch 1 with 'uniform' assignor in ")
               for m in caplog.messages)
    assert [name for name in recorder.names()] == ["rebalance_started", "member_joined", "target_assigned",
                                                   "member_reconciled", "rebalance_completed"]
    started = recorder.calls[0][1][0]
    assert (started.group_epoch, started.previous_epoch, started.cause.category.value) == (1, 0, "member_joined")
    assert started.cause.text == "Member a joins the consumer group using the consumer protocol."
    [root] = roots(exporter)
    assert root.attributes["coordinator.group.protocol"] == "consumer"
    assert root.attributes["coordinator.rebalance.outcome"] == "stable"
    assert tracer.trace_id_for(GROUP) == format(root.context.trace_id, "032x")
    recorder.take()

    env.advance(10)
    await env.heartbeat("b", 0)  # epoch 2: a must give up half of foo before b gets it
    env.advance(20)
    await env.heartbeat("a", a.member_epoch, owned=a.assignment)  # told to revoke
    env.advance(30)
    kept = await env.heartbeat("a", a.member_epoch, owned={FOO: (0, 1, 2)})  # revoked: epoch 2
    env.advance(40)
    await env.heartbeat("b", 2, owned={})  # b gets its partitions
    calls = recorder.take()
    assert calls[-1][0] == "rebalance_completed" and calls[-1][1][:2] == (2, 2)
    steps = [(c[1][0].member_id, c[1][0].steps) for c in calls if c[0] == "member_reconciled"]
    assert ("a", ("revocation requested",)) in steps
    assert ("a", ("partitions revoked", "epoch reached")) in steps
    assert kept.member_epoch == 2
    second = roots(exporter)[-1]
    assert second.attributes["coordinator.group_epoch"] == 2
    assert second.attributes["coordinator.rebalance.reason_category"] == "member_joined"
    assert second.links[0].attributes["coordinator.link"] == "previous rebalance"
    spans = {s.name: s for s in children(exporter, second)}
    assert spans["target assignment"].attributes["coordinator.assignment_epoch"] == 2
    reconcile_a = spans["reconcile a"]
    assert [e.name for e in reconcile_a.events] == ["revocation requested", "partitions revoked", "epoch reached"]
    assert (reconcile_a.end_time - reconcile_a.start_time) // 1_000_000 == 50  # target (t+10) to revoked (t+60)
    assert second.end_time - second.start_time == 90 * 1_000_000  # from b joining (t+10) to b reconciled (t+100)


async def test_a_fenced_member_has_kafkas_line_and_supersedes(traced) -> None:  # type: ignore[no-untyped-def]
    env, recorder, tracer, exporter = traced
    a = await env.heartbeat("a", 0)
    b = await env.heartbeat("b", 0)
    recorder.take()
    c = await env.heartbeat("c", 0)  # epoch 3, under way while b's session runs out
    for _ in range(4):
        env.advance(SESSION_MS // 4)
        a = await env.heartbeat("a", a.member_epoch, owned=a.assignment)
        c = await env.heartbeat("c", c.member_epoch, owned=c.assignment)
    calls = recorder.take()
    failed = [args for name, args in calls if name == "member_failed"]
    assert [args[0] for args in failed] == ["b"]
    assert failed[0][2] == "Member b fenced from the group because the member session expired."
    superseding = [args[0] for name, args in calls if name == "rebalance_started"][-1]
    assert superseding.cause.category.value == "session_timeout" and superseding.cause.member_id == "b"
    superseded = [r for r in roots(exporter) if r.attributes["coordinator.group_epoch"] == 3]
    assert superseded and superseded[0].attributes["coordinator.rebalance.outcome"] == "superseded"
    assert b.member_epoch == 2


async def test_a_group_five_times_the_span_budget_makes_bounded_traces() -> None:
    # each join recomputes the target over every member: the cost grows with the square of the group, so the group
    # is a few times the span budget (what the bounds are about), not the thousands a trace must also survive
    size = 5 * MAX_MEMBER_SPANS
    env = Env(group_consumer_max_size=2_000)
    env.topics = StaticTopics([TopicImage(FOO, "foo", 2_000)])
    env.runtime.consumer_groups.topics = env.topics
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = ConsumerRebalanceTracer(provider.get_tracer("test"))
    env.runtime.observer = tracer
    members = {f"m{i:04d}": await env.heartbeat(f"m{i:04d}", 0) for i in range(size)}
    exporter.clear()
    await env.heartbeat("late", 0)  # epoch size + 1: every member takes the new epoch, some give partitions up
    owned = {member_id: response.assignment for member_id, response in members.items()}
    for _ in range(4):  # revoke, then take what others released
        for member_id in members:
            response = await env.heartbeat(member_id, env.group().members[member_id].member_epoch,
                                           owned=owned[member_id])
            if response.assignment is not None:
                owned[member_id] = response.assignment
        await env.heartbeat("late", env.group().members["late"].member_epoch, owned=None)
        if latest(exporter, size + 1):
            break
    [superseded] = latest(exporter, size)  # the bump of the last of the group, cut short by "late"
    assert superseded.attributes["coordinator.rebalance.outcome"] == "superseded"
    [root] = latest(exporter, size + 1)
    assert root.attributes["coordinator.rebalance.outcome"] == "stable"
    assert root.attributes["coordinator.members.reconciled"] == size + 1
    spans = children(exporter, root)
    assert len(spans) == MAX_MEMBER_SPANS + 1  # the target assignment span, and the member spans' budget
    assert root.attributes["coordinator.members.unsampled"] > 0  # the moves past the budget are counted
    assert len(root.events) <= 64
    await env.runtime.shutdown()
    await env.timer.close()


async def test_a_static_member_leaving_for_now_is_replaced(traced) -> None:  # type: ignore[no-untyped-def]
    env, recorder, tracer, exporter = traced
    await env.heartbeat("a", 0, instance_id="i-a")
    await env.heartbeat("b", 0)
    recorder.take()
    await env.heartbeat("a", -2, instance_id="i-a", topics=None)
    left = recorder.take()
    assert [name for name, _ in left] == ["member_left"]
    assert left[0][1] == ("a", "i-a", "Static member a with instance id i-a temporarily left the consumer group.")
    await env.heartbeat("a2", 0, instance_id="i-a")
    calls = recorder.take()
    assert ("member_replaced", ("a", "a2", "i-a")) in calls
    assert "rebalance_started" not in [name for name, _ in calls]  # same subscription: no new epoch


async def test_metrics_count_consumer_group_rebalances_by_category() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from coordinator.telemetry.metrics import MetricsObserver

    env = Env()
    reader = InMemoryMetricReader()
    env.runtime.observer = MetricsObserver(MeterProvider(metric_readers=[reader]).get_meter("test"))
    a = await env.heartbeat("a", 0)
    await env.heartbeat("b", 0)
    for _ in range(4):  # b falls silent
        env.advance(SESSION_MS // 4)
        a = await env.heartbeat("a", a.member_epoch, owned=a.assignment)
    points: dict[tuple[str, str], float] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for metric in (m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics):
        for point in metric.data.data_points:  # type: ignore[union-attr]
            points[(metric.name, str(point.attributes.get("reason", "")))] = getattr(point, "value", 0)
    assert points[("coordinator.rebalances", "member_joined")] == 2
    assert points[("coordinator.rebalances", "session_timeout")] == 1
    assert points[("coordinator.session.expirations", "")] == 1
    assert points[("coordinator.members.joined", "")] == 2
    await env.runtime.shutdown()
    await env.timer.close()


async def test_a_group_loaded_mid_rebalance_has_its_end_traced(traced) -> None:  # type: ignore[no-untyped-def]
    """After a restart (or a failover) the new owner traces the rest of the rebalance under way; its duration is
    not known here, so no completion event with a wrong one (the recorder sees None)."""
    env, _recorder, _tracer, _exporter = traced
    await env.heartbeat("a", 0)
    await env.heartbeat("b", 0)
    await env.heartbeat("a", 1, owned={FOO: tuple(range(6))})  # told to revoke: the rebalance to epoch 2 is on
    restarted = Env()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    recorder = Recorder()
    restarted.runtime = GroupRuntime(restarted.config, restarted.timer, env.store, restarted.clock,
                                     ObserverMux(recorder, ConsumerRebalanceTracer(provider.get_tracer("test"))))
    restarted.runtime.consumer_groups.topics = restarted.topics
    try:
        await restarted.runtime.load()
        assert recorder.take() == [("rebalance_resumed", (2, 2))]
        await restarted.heartbeat("a", 1, owned={FOO: (0, 1, 2)})  # revoked
        await restarted.heartbeat("b", 2, owned={})  # gets its half
        assert recorder.calls[-1] == ("rebalance_completed", (2, 2, None))
        [root] = roots(exporter)
        assert root.attributes["coordinator.rebalance.reason_category"] == "resumed"
        assert root.attributes["coordinator.rebalance.outcome"] == "stable"
        assert "coordinator.rebalance.duration_ms" not in root.attributes
        assert {s.name for s in children(exporter, root)} == {"reconcile a", "reconcile b"}
    finally:
        await restarted.runtime.shutdown()
        await restarted.timer.close()
