"""End to end against a real Jaeger (v2 all-in-one, built by scripts/setup.sh): the failed-member scenario's
traces, exported as the OTEL_* variables say (OTLP/HTTP, then OTLP/gRPC), come back from Jaeger's query APIs
for service `coordinator` with the member-failed event."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

from coordinator.embedded.jaeger import EmbeddedJaeger, built_jaeger
from coordinator.group.state import GroupState
from coordinator.telemetry.otel import start_telemetry
from tests.support.event_topic import read_events
from tests.support.group_harness import form_group
from tests.support.metrics import scrape
from tests.support.ports import free_port
from tests.support.service import REBALANCE_IN_PROGRESS, service, unique, until_loaded
from tests.support.telemetry_scenario import run_failure_scenario, telemetry_env
from tests.support.wire import heartbeat, join, join_with_member_id, sync

pytestmark = pytest.mark.integration


def get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:  # Jaeger explains itself in the body
        raise AssertionError(f"GET {url}: {exc.code} {exc.read()[:500]!r}") from None


def wait_for(fetch: Any, timeout_s: float = 60.0) -> Any:
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
                                     "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_http_endpoint,
                                     "OTEL_METRICS_EXPORTER": "none"})  # Jaeger takes traces only
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
        "query.service_name": "coordinator", "query.num_traces": 20,
        "query.start_time_min": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_us / 1e6 - 3600)),
        "query.start_time_max": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_us / 1e6 + 60))})
    found = get_json(f"{jaeger.query_url}/api/v3/traces?{v3}")
    trace_ids = {span["traceId"].lower() for rs in found["result"]["resourceSpans"] for ss in rs["scopeSpans"]
                 for span in ss["spans"]}
    assert trace_id in trace_ids


async def test_traces_reach_jaeger_over_otlp_grpc(jaeger: EmbeddedJaeger) -> None:
    telemetry = start_telemetry(env={"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "coordinator-grpc",
                                     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": jaeger.otlp_grpc_endpoint})
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


async def test_coordinator_serve_traces_a_real_rebalance_into_jaeger(jaeger: EmbeddedJaeger,
                                                                     kafka_bootstrap: str) -> None:
    """The whole path: `coordinator serve` configured by OTEL_* variables, clients on the wire, the state and
    event topics in real Kafka, the trace in real Jaeger, the counters on the Prometheus endpoint, and the trace
    id shared by the event topic's records and the log lines."""
    group = unique("traced")
    event_topic = unique("__events")
    metrics_port = free_port()
    otel = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{jaeger.otlp_http_endpoint}/v1/traces",
            "OTEL_SERVICE_NAME": "coordinator", "OTEL_BSP_SCHEDULE_DELAY": "200"}
    settings = ("group.initial.rebalance.delay.ms=300", "group.min.session.timeout.ms=1000")
    async with service(kafka_bootstrap, unique("__state"), *settings, event_topic=event_topic,
                       args=("--metrics-listen", f"127.0.0.1:{metrics_port}"), extra_env=otel) as running:
        a, b = await running.client(), await running.client()
        await until_loaded(a, group)
        b_first_seen = time.monotonic()  # b's join, sync and (none) heartbeats all come after this
        first = await asyncio.gather(join_with_member_id(a, group, session_timeout_ms=20_000),
                                     join_with_member_id(b, group, session_timeout_ms=1_500))
        a_id, b_id, generation = first[0].member_id, first[1].member_id, first[0].generation_id
        members = {a_id: a, b_id: b}
        plan = {a_id: b"A", b_id: b"B"}
        synced = await asyncio.gather(*(sync(c, group, generation, m, plan if m == first[0].leader else None)
                                        for m, c in members.items()))
        assert [s.error_code for s in synced] == [0, 0]
        deadline = time.monotonic() + 15
        while (await a.request(heartbeat(group, generation, a_id))).error_code != REBALANCE_IN_PROGRESS:
            assert time.monotonic() < deadline, "b's session never expired"
            await asyncio.sleep(0.2)
        b_failed_by = time.monotonic()  # a heard of the rebalance b's failure started
        again = await join(a, group, a_id, session_timeout_ms=20_000)
        assert again.error_code == 0
        assert (await sync(a, group, again.generation_id, a_id, {a_id: b"A"})).error_code == 0
        metrics = await asyncio.to_thread(scrape, f"http://127.0.0.1:{metrics_port}/metrics")
        for client in (a, b):
            await client.close()
        assert await running.terminate() == 0  # flushes the spans
        log_text = running.log_text()

    assert metrics[("coordinator_rebalances_total", "session_timeout")] == 1
    assert metrics[("coordinator_session_expirations_total", "")] == 1
    assert metrics[("coordinator_connections", "")] >= 2
    assert ("coordinator_loop_late_ticks_total", "") in metrics and ("coordinator_gc_collections_total", "") in metrics

    def traced_failure() -> dict[str, Any] | None:
        trace = failed_member_trace(jaeger)
        return trace if trace and any(t["value"] == group for s in trace["spans"] for t in s["tags"]) else None

    trace = wait_for(traced_failure)
    names = {span["operationName"] for span in trace["spans"]}
    assert {"rebalance", "join phase", "sync phase", "state-topic write", f"JoinGroup wait {a_id}"} <= names
    root = next(span for span in trace["spans"] if span["operationName"] == "rebalance")
    failed = [{f["key"]: f["value"] for f in log["fields"]} for log in root["logs"]]
    failed = next(fields for fields in failed if fields.get("event") == "member failed")
    assert failed["message"] == f"Member {b_id} in group {group} has failed, removing it from the group"
    assert failed["coordinator.session_timeout_ms"] == 1_500
    # never before the session timeout; how late depends on the machine, so the upper bound is what the test saw:
    # no later than the time from b's first request to a's hearing of the rebalance
    assert 1_500 <= failed["coordinator.since_last_heartbeat_ms"] <= (b_failed_by - b_first_seen) * 1000 + 5, (
        failed, b_failed_by - b_first_seen)

    def failure_event(events: list[dict[str, Any]]) -> bool:
        return any(e["type"] == "member_failed" for e in events)

    events = await asyncio.to_thread(read_events, kafka_bootstrap, event_topic, group, failure_event)
    assert next(e for e in events if e["type"] == "member_failed")["trace_id"] == trace["traceID"]
    assert f"event=rebalance_trace_started group={group} generation=1 reason_category=session_timeout " \
           f"trace_id={trace['traceID']}" in log_text
    assert f"Member {b_id} in group {group} has failed, removing it from the group\n" in log_text


def test_coordinator_jaeger_command_runs_and_stops_cleanly() -> None:
    """`coordinator jaeger` with no jaeger on PATH: says it uses the module build (no UI), prints endpoints that
    answer, and stops Jaeger on SIGTERM."""
    import os
    import signal
    import subprocess
    import sys

    from coordinator.embedded.broker import process_alive
    from tests.support.pipes import DrainedFile

    if built_jaeger() is None:
        pytest.fail("the project's Jaeger build is missing: run scripts/setup.sh")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if not os.path.exists(os.path.join(p, "jaeger")))
    process = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "jaeger"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PATH": path})
    stderr = DrainedFile(process.stderr)  # Jaeger's own log while it runs: never left to fill the pipe
    stdout = None
    try:
        lines = []
        assert process.stdout is not None
        while not lines or not lines[-1].startswith("  export OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="):
            line = process.stdout.readline()
            assert line, f"coordinator jaeger ended early: {lines} {stderr.ended(10)}"
            lines.append(line.rstrip("\n"))
        stdout = DrainedFile(process.stdout)  # whatever it prints after the settings
        assert lines[0].startswith("jaeger: module build v2.13.0")
        assert "placeholder instead of the web UI" in lines[1]
        pid = int(next(line for line in lines if line.startswith("Jaeger running")).split("pid ")[1].split(")")[0])
        query = next(line for line in lines if line.strip().startswith("UI and query API")).split()[4]
        assert "data" in get_json(f"{query}/api/services")
        endpoint = lines[-1].split("=", 1)[1]
        assert endpoint.startswith("http://127.0.0.1:") and endpoint.endswith("/v1/traces")
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, stderr.text()[-3000:]
        assert not process_alive(pid)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        stderr.ended(10)
        if stdout is not None:
            stdout.ended(10)
