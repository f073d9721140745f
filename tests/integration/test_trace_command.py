"""`coordinator trace` against the real Jaeger (the project's v2 build): the failed-member scenario's rebalances
(tests/telemetry_scenario.py) exported over OTLP, then read back and drawn by the command as a user runs it:
by trace id, the latest of a group, and --follow while the scenario runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from coordinator.embedded.jaeger import EmbeddedJaeger
from coordinator.telemetry.otel import start_telemetry
from coordinator.telemetry.trace_render import short_member
from coordinator.telemetry.trace_view import JaegerQuery, TraceSourceError
from tests.support.pipes import DrainedFile
from tests.support.telemetry_scenario import run_failure_scenario, telemetry_env

pytestmark = pytest.mark.integration


def trace_command(jaeger: EmbeddedJaeger, *args: str) -> list[str]:
    return [sys.executable, "-m", "coordinator.cli", "trace", "--jaeger-url", jaeger.query_url, "--width", "200",
            "--color", "never", *args]


async def export_failure_scenario(jaeger: EmbeddedJaeger, service: str) -> tuple[object, str]:
    """The scenario's two rebalances (a and b form group g; b fails; a alone) in Jaeger; returns the marks and the
    failure rebalance's trace id."""
    telemetry = start_telemetry(env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{jaeger.otlp_http_endpoint}/v1/traces",
                                     "OTEL_METRICS_EXPORTER": "none", "OTEL_SERVICE_NAME": service})
    env, instrumented, events = telemetry_env(telemetry, time.time_ns() - 60 * 10**9)
    try:
        marks = await run_failure_scenario(env, events)
    finally:
        await env.close()
        instrumented.uninstall()
        telemetry.shutdown()  # flushes the spans to Jaeger
    return marks, next(r["trace_id"] for r in events.records if r["type"] == "member_failed")


def wait_until_in_jaeger(query: JaegerQuery, trace_id: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            query.by_id(trace_id)
            return
        except TraceSourceError:
            assert time.monotonic() < deadline, f"trace {trace_id} never reached Jaeger"
            time.sleep(0.2)


async def test_trace_command_draws_the_failed_member_rebalance_from_jaeger(jaeger: EmbeddedJaeger) -> None:
    marks, trace_id = await export_failure_scenario(jaeger, "coordinator-trace-cmd")
    query = JaegerQuery(jaeger.query_url, service="coordinator-trace-cmd")
    wait_until_in_jaeger(query, trace_id)
    a, b = marks.a.member_id, marks.b.member_id  # type: ignore[attr-defined]

    by_id = subprocess.run(trace_command(jaeger, "--service", "coordinator-trace-cmd", trace_id),
                           capture_output=True, text=True, timeout=60)
    assert by_id.returncode == 0, by_id.stderr
    out = by_id.stdout
    assert f"trace {trace_id}" in out
    assert "rebalance of g" in out and "[session_timeout]" in out
    for phase in ("join phase", "sync phase", "state-topic write"):
        assert phase in out
    assert f"JoinGroup {short_member(a)} (last)" in out and f"SyncGroup {short_member(a)}" in out  # a's waits
    assert f"member failed: Member {b} in group g has failed, removing it from the group" in out
    assert "reason=session timeout" in out and "client=b" in out
    # durations of the scenario's manual clock: 1.5 s to a's re-join, 200 ms to its sync, a 40 ms write
    assert "1740 ms" in out.splitlines()[0]  # the root: 1500 + 200 + 40
    write = next(line for line in out.splitlines() if "state-topic write" in line)
    assert "+1700 ms   40 ms" in write

    # the latest rebalance of the group (the failure one, not the group's formation), at 80 columns
    latest = subprocess.run([*trace_command(jaeger, "--service", "coordinator-trace-cmd", "--group", "g",
                                            "--last", "1"), "--width", "80"],
                            capture_output=True, text=True, timeout=60)
    assert latest.returncode == 0, latest.stderr
    assert f"trace {trace_id}" in latest.stdout and latest.stdout.count("━━ rebalance of g") == 1
    assert max(len(line) for line in latest.stdout.splitlines()) <= 80
    listed = subprocess.run(trace_command(jaeger, "--service", "coordinator-trace-cmd", "--list"),
                            capture_output=True, text=True, timeout=60)
    assert [line.split()[1] for line in listed.stdout.splitlines()][-1] == trace_id
    assert len(listed.stdout.splitlines()) == 2  # formation, then the failure

    unknown = subprocess.run(trace_command(jaeger, "0123456789abcdef0123456789abcdef"), capture_output=True,
                             text=True, timeout=60)
    assert unknown.returncode == 1 and "has no trace 0123456789abcdef0123456789abcdef" in unknown.stderr


async def test_trace_follow_draws_rebalances_as_they_reach_jaeger(jaeger: EmbeddedJaeger) -> None:
    service = "coordinator-trace-follow"
    process = subprocess.Popen(trace_command(jaeger, "--service", service, "--follow"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    stdout, stderr = DrainedFile(process.stdout), DrainedFile(process.stderr)
    try:
        deadline = time.monotonic() + 30
        while "no rebalance traces" not in stdout.text():  # it has looked once: nothing yet
            assert process.poll() is None and time.monotonic() < deadline, stderr.text()
            time.sleep(0.1)
        marks, trace_id = await export_failure_scenario(jaeger, service)
        deadline = time.monotonic() + 60
        while f"trace {trace_id}" not in stdout.text():
            assert process.poll() is None and time.monotonic() < deadline, "--follow never drew the new rebalance"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0, stderr.text()
        text = stdout.ended(10)
        b = marks.b.member_id  # type: ignore[attr-defined]
        assert f"Member {b} in group g has failed, removing it from the group" in text
        assert text.count("━━ rebalance of g") == 2  # each drawn once, though it polled many times
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        stderr.ended(10)
