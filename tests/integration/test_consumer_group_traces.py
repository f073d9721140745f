"""A consumer group's (KIP-848) rebalances in the real Jaeger and on the event topic: two confluent-kafka consumers
with `group.protocol=consumer` against `coordinator serve` (relay on, OTLP export by the OTEL_* variables); one
is killed and fenced at its session timeout. Asserted: the rebalance traces (cause, group epochs, the target
assignment span, each member's reconcile span and its steps, the fenced member with Kafka 4.1's line), the event
topic's records with `protocol: consumer` and the same trace ids, and `coordinator trace --group` drawing it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest

from coordinator.embedded.jaeger import EmbeddedJaeger
from tests.support.event_topic import read_events
from tests.support.polling import wait_until
from tests.support.relay import consumer_group_described as describe
from tests.support.relay import create_topic, settled_assignment, start_consumers, stop_all
from tests.support.service import service, unique

pytestmark = pytest.mark.integration

TIMEOUT_S = 90
FAST = ("group.consumer.min.heartbeat.interval.ms=500", "group.consumer.heartbeat.interval.ms=500",
        "group.consumer.min.session.timeout.ms=6000", "group.consumer.session.timeout.ms=6000")


def jaeger_traces(jaeger: EmbeddedJaeger, service_name: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"service": service_name, "lookback": "1h", "limit": "100"})
    try:
        with urllib.request.urlopen(f"{jaeger.query_url}/api/traces?{query}", timeout=10) as response:
            return list(json.load(response)["data"])
    except OSError:
        return []


def tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span["tags"]}


def logs(span: dict[str, Any]) -> list[dict[str, Any]]:
    return [{f["key"]: f["value"] for f in log["fields"]} for log in span["logs"]]


async def test_a_consumer_groups_rebalances_are_traced_into_jaeger(jaeger: EmbeddedJaeger,
                                                                   kafka_bootstrap: str) -> None:
    topic, group, event_topic = unique("kip848-traced"), unique("kip848-traced-group"), unique("__events")
    service_name = unique("coordinator-kip848")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic)
    otel = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{jaeger.otlp_http_endpoint}/v1/traces",
            "OTEL_SERVICE_NAME": service_name, "OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_METRICS_EXPORTER": "none"}
    async with service(kafka_bootstrap, unique("__state"), *FAST, event_topic=event_topic, relay=True,
                       extra_env=otel) as running:
        bootstrap = f"127.0.0.1:{running.port}"
        consumers = await start_consumers([("confluent", "rdk-1")], bootstrap, topic, group, "uniform",
                                          protocol="consumer")
        try:  # the second joins once the first owns everything: the first has to revoke before it gets any
            await wait_until(lambda: settled_assignment(consumers), TIMEOUT_S, "the first consumer owning all six")
            consumers += await start_consumers([("confluent", "rdk-2")], bootstrap, topic, group, "uniform",
                                               protocol="consumer")
            await wait_until(lambda: settled_assignment(consumers), TIMEOUT_S, "two consumers sharing six partitions")
            victim, survivor = consumers
            members = {m.client_id: m.member_id for m in (await describe(running.port, group)).members}
            await victim.kill()  # no leave: fenced at its session timeout
            await wait_until(lambda: sorted(survivor.assigned) == list(range(6)), TIMEOUT_S,
                             "the survivor owning every partition")
            described = await describe(running.port, group)
            assert described.group_state == "Stable"
        finally:
            await stop_all(consumers)
        assert await running.terminate() == 0  # flushes the spans
        log_text = running.log_text()
    victim_id, survivor_id = members["rdk-1"], members["rdk-2"]
    fence_line = f"Member {victim_id} fenced from the group because the member session expired."

    def traced() -> dict[int, dict[str, Any]] | None:
        found = {}
        for trace in jaeger_traces(jaeger, service_name):
            roots = [s for s in trace["spans"] if s["operationName"] == "rebalance"]
            if roots and tags(roots[0]).get("messaging.consumer.group.name") == group:
                found[tags(roots[0])["coordinator.group_epoch"]] = trace
        return found if len(found) >= 3 else None

    by_epoch = await asyncio.to_thread(lambda: _poll(traced))
    assert sorted(by_epoch)[:3] == [1, 2, 3]  # the first join, the second, the fence

    second = by_epoch[2]
    root = next(s for s in second["spans"] if s["operationName"] == "rebalance")
    attributes = tags(root)
    assert attributes["coordinator.group.protocol"] == "consumer"
    assert attributes["coordinator.rebalance.reason_category"] == "member_joined"
    assert attributes["coordinator.rebalance.outcome"] == "stable"
    assert attributes["coordinator.group_epoch.previous"] == 1
    assert attributes["coordinator.assignor"] == "uniform"
    names = {s["operationName"] for s in second["spans"]}
    assert "target assignment" in names
    # the first member gives half of the topic up before the joiner gets it: revoke before assign
    first, joiner = victim_id, survivor_id
    assert attributes["coordinator.rebalance.member.id"] == joiner
    reconcile_first = next(s for s in second["spans"] if s["operationName"] == f"reconcile {first}")
    steps = [log["event"] for log in logs(reconcile_first)]
    assert steps[0] == "revocation requested" and steps[-1] == "epoch reached", steps
    reconcile_joiner = next(s for s in second["spans"] if s["operationName"] == f"reconcile {joiner}")
    assert "assignment delivered" in [log["event"] for log in logs(reconcile_joiner)]

    fence = by_epoch[3]
    root = next(s for s in fence["spans"] if s["operationName"] == "rebalance")
    assert tags(root)["coordinator.rebalance.reason_category"] == "session_timeout"
    assert tags(root)["coordinator.rebalance.reason"] == fence_line
    failed = next(log for log in logs(root) if log["event"] == "member failed")
    assert failed["message"] == fence_line and failed["coordinator.member.id"] == victim_id
    assert tags(root)["coordinator.rebalance.outcome"] == "stable"
    assert f"[GroupId {group}] {fence_line}\n" in log_text

    def fence_completed(events: list[dict[str, Any]]) -> bool:
        return any(e["type"] == "rebalance_completed" and e["generation"] == 3 for e in events)

    events = await asyncio.to_thread(read_events, kafka_bootstrap, event_topic, group, fence_completed)
    assert {e.get("protocol") for e in events} == {"consumer"}
    started = [e for e in events if e["type"] == "rebalance_started"]
    assert [(e["generation"], e["cause_category"]) for e in started][:3] == [
        (0, "member_joined"), (1, "member_joined"), (2, "session_timeout")]
    assert started[2]["trace_id"] == fence["traceID"]
    failure = next(e for e in events if e["type"] == "member_failed")
    assert (failure["member_id"], failure["reason"], failure["trace_id"]) == (victim_id, fence_line,
                                                                             fence["traceID"])
    completed = {e["generation"]: e for e in events if e["type"] == "rebalance_completed"}
    assert completed[3]["member_count"] == 1 and completed[3]["trace_id"] == fence["traceID"]
    assert completed[3]["duration_ms"] >= 0

    def draw(*args: str) -> str:
        drawn = subprocess.run([sys.executable, "-m", "coordinator.cli", "trace", "--jaeger-url", jaeger.query_url,
                                "--service", service_name, "--width", "160", "--color", "never", *args],
                               capture_output=True, text=True, timeout=60)
        assert drawn.returncode == 0, drawn.stderr
        return drawn.stdout

    out = draw(fence["traceID"])
    assert f"rebalance of {group}" in out and "group epoch 2 → 3" in out and "[session_timeout]" in out
    assert "target assignment" in out and "reconcile" in out
    assert f"member failed: {fence_line}" in out
    latest = draw("--group", group, "--last", "1")  # the survivor's leave when it stopped: the group empty
    assert "group epoch 3 → 4" in latest and "empty" in latest and "[member_left]" in latest


def _poll(fetch: Any, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = fetch()
        if value:
            return value
        assert time.monotonic() < deadline, "the traces never reached Jaeger"
        time.sleep(0.3)
