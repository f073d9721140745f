"""End to end against a real Jaeger (v2 all-in-one, built by scripts/setup.sh): the failed-member scenario's
traces, exported as the OTEL_* variables say (OTLP/HTTP, then OTLP/gRPC), come back from Jaeger's query APIs
for service `coordinator` with the member-failed event."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from coordinator.embedded.jaeger import EmbeddedJaeger, built_jaeger
from coordinator.group.state import GroupState
from coordinator.telemetry.otel import start_telemetry
from tests.telemetry_scenario import run_failure_scenario, telemetry_env
from tests.unit.test_group_harness import form_group

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def jaeger() -> Iterator[EmbeddedJaeger]:
    binary = built_jaeger()
    if binary is None:
        pytest.fail("the project's Jaeger build is missing: run scripts/setup.sh (it builds it once per machine)")
    with EmbeddedJaeger(binary) as running:
        yield running


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def wait_for(fetch: Any, timeout_s: float = 30.0) -> Any:
    """Polls `fetch()` until it returns something truthy (Jaeger's batch processor writes asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = fetch()
        if found:
            return found
        assert time.monotonic() < deadline, "Jaeger never returned the expected trace"
        time.sleep(0.2)


def failed_member_trace(jaeger: EmbeddedJaeger) -> dict[str, Any] | None:
    query = urllib.parse.urlencode({"service": "coordinator", "lookback": "1h", "limit": 20})
    for trace in get_json(f"{jaeger.query_url}/api/traces?{query}")["data"]:
        for span in trace["spans"]:
            if span["operationName"] == "rebalance" and any(
                    field["key"] == "event" and field["value"] == "member failed"
                    for log in span["logs"] for field in log["fields"]):
                return trace
    return None


async def test_jaeger_returns_the_rebalance_trace_with_the_failed_member(jaeger: EmbeddedJaeger) -> None:
    telemetry = start_telemetry(env={"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                                     "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http_endpoint})
    assert telemetry.describe == ["traces: OTLP/HTTP"]
    env, instrumented, events = telemetry_env(telemetry, time.time_ns() - 60 * 10**9)  # spans end in the past
    try:
        marks = await run_failure_scenario(env, events)
    finally:
        await env.close()
        instrumented.uninstall()
        telemetry.shutdown()

    trace = wait_for(lambda: failed_member_trace(jaeger))
    trace_id = trace["traceID"]
    assert trace_id == next(r["trace_id"] for r in events.records if r["type"] == "member_failed")
    by_id = get_json(f"{jaeger.query_url}/api/traces/{trace_id}")["data"][0]
    operations = sorted(span["operationName"] for span in by_id["spans"])
    assert operations == sorted(["rebalance", "join phase", "sync phase", "state-topic write",
                                 f"JoinGroup wait {marks.a.member_id}", f"SyncGroup wait {marks.a.member_id}"])
    assert {by_id["processes"][span["processID"]]["serviceName"] for span in by_id["spans"]} == {"coordinator"}
    root = next(span for span in by_id["spans"] if span["operationName"] == "rebalance")
    failed = next(log for log in root["logs"] if {"key": "event", "type": "string", "value": "member failed"}
                  in log["fields"])
    fields = {f["key"]: f["value"] for f in failed["fields"]}
    assert fields["message"] == f"Member {marks.b.member_id} in group g has failed, removing it from the group"
    assert fields["messaging.client.id"] == "b"
    tags = {t["key"]: t["value"] for t in root["tags"]}
    assert tags["messaging.consumer.group.name"] == "g"
    assert tags["coordinator.rebalance.reason_category"] == "session_timeout"
    assert root["duration"] == (marks.stable_ms - marks.failed_ms) * 1000  # microseconds

    # the v3 API (OTLP JSON) finds it too, searching by service within a time window
    now_us = time.time_ns() // 1000
    v3 = urllib.parse.urlencode({
        "query.service_name": "coordinator",
        "query.start_time_min": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_us / 1e6 - 3600)),
        "query.start_time_max": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_us / 1e6 + 60))})
    found = get_json(f"{jaeger.query_url}/api/v3/traces?{v3}")
    trace_ids = {span["traceId"].lower() for rs in found["result"]["resourceSpans"] for ss in rs["scopeSpans"]
                 for span in ss["spans"]}
    assert trace_id in trace_ids


async def test_traces_reach_jaeger_over_otlp_grpc(jaeger: EmbeddedJaeger) -> None:
    telemetry = start_telemetry(env={"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "coordinator-grpc",
                                     "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_grpc_endpoint})
    assert telemetry.describe == ["traces: OTLP/gRPC"]
    env, instrumented, _events = telemetry_env(telemetry, time.time_ns() - 30 * 10**9)
    try:
        await form_group(env, env.client("a"), env.client("b"))
        assert env.state() is GroupState.STABLE
    finally:
        await env.close()
        instrumented.uninstall()
        telemetry.shutdown()
    query = urllib.parse.urlencode({"service": "coordinator-grpc", "lookback": "1h"})
    traces = wait_for(lambda: get_json(f"{jaeger.query_url}/api/traces?{query}")["data"])
    assert {s["operationName"] for s in traces[0]["spans"]} >= {"rebalance", "join phase", "sync phase"}
