"""OpenTelemetry configuration from OTEL_* variables: what turns tracing and metrics on, the protocols, the
service name, and clean errors for what we cannot provide."""

from __future__ import annotations

import time
from typing import Any

import pytest

from coordinator.telemetry.otel import TelemetryConfigError, resource, start_telemetry


def exporter_of(telemetry) -> object:  # type: ignore[no-untyped-def]
    processor = telemetry.tracer_provider._active_span_processor._span_processors[0]
    return processor._batch_processor._exporter


def test_nothing_configured_means_nothing_on() -> None:
    telemetry = start_telemetry(env={})
    assert telemetry.tracer_provider is None and telemetry.meter_provider is None and not telemetry.tracing


def test_an_endpoint_turns_on_otlp_http_with_the_signal_path() -> None:
    telemetry = start_telemetry(env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
                                     "OTEL_METRICS_EXPORTER": "none"})
    try:
        assert telemetry.describe == ["traces: OTLP/HTTP"] and telemetry.meter_provider is None
        assert exporter_of(telemetry)._endpoint == "http://collector:4318/v1/traces"
    finally:
        telemetry.shutdown()


def test_grpc_protocol_and_a_traces_only_endpoint() -> None:
    telemetry = start_telemetry(env={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
                                     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"})
    try:
        assert telemetry.describe == ["traces: OTLP/gRPC"] and telemetry.meter_provider is None
        assert type(exporter_of(telemetry)).__module__.startswith("opentelemetry.exporter.otlp.proto.grpc")
    finally:
        telemetry.shutdown()


def test_sdk_disabled_and_none_exporters() -> None:
    assert start_telemetry(env={"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}
                           ).tracer_provider is None
    telemetry = start_telemetry(env={"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
                                     "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"})
    assert telemetry.tracer_provider is None and telemetry.meter_provider is None


@pytest.mark.parametrize("env", [
    {"OTEL_TRACES_EXPORTER": "zipkin"},
    {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
    {"OTEL_METRICS_EXPORTER": "statsd"},
])
def test_what_we_cannot_provide_is_a_clear_error(env: dict[str, str]) -> None:
    with pytest.raises(TelemetryConfigError):
        start_telemetry(env=env)


def test_service_name_defaults_to_coordinator_and_follows_the_variables() -> None:
    assert resource({}).attributes["service.name"] == "coordinator"
    assert resource({"OTEL_RESOURCE_ATTRIBUTES": "service.name=c2,deployment.environment=test"}).attributes[
        "service.name"] == "c2"
    named = resource({"OTEL_SERVICE_NAME": "c3", "OTEL_RESOURCE_ATTRIBUTES": "service.name=c2,team=x%20y"})
    assert named.attributes["service.name"] == "c3" and named.attributes["team"] == "x y"


async def test_runtime_health_counters_are_exported() -> None:
    import asyncio
    import gc

    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from coordinator.runtime_health import RuntimeHealth
    from coordinator.telemetry.metrics import MetricsObserver

    reader = InMemoryMetricReader()
    telemetry = start_telemetry(env={}, metric_readers=[reader])
    health = RuntimeHealth()
    health.start()
    try:
        MetricsObserver(telemetry.meter_provider.get_meter("test")).watch_runtime_health(health)
        gc.collect()
        await asyncio.sleep(0.05)
        data = reader.get_metrics_data()
    finally:
        await health.stop()
        telemetry.shutdown()
    points = {m.name: m.data.data_points for rm in data.resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics}
    assert set(points) >= {"coordinator.loop.late_ticks", "coordinator.loop.lag.late", "coordinator.loop.lag.max",
                           "coordinator.gc.collections", "coordinator.gc.pause"}
    full = [p.value for p in points["coordinator.gc.collections"] if p.attributes["generation"] == "2"]
    assert full and full[0] >= 1  # the gc.collect() above, seen by the collector monitor


async def test_relay_requests_bytes_and_buffer_pool_are_exported() -> None:
    """A real upstream link against a loopback server that answers each request: the relay's counters move by
    the frames that crossed, and the metrics export them."""
    import asyncio
    import struct

    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from coordinator.relay.buffer_pool import BufferPool
    from coordinator.relay.upstream import RelayCounters, UpstreamLink
    from coordinator.telemetry.metrics import MetricsObserver

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                body = await reader.readexactly(size)
            except asyncio.IncompleteReadError:
                break
            writer.write(struct.pack(">i", 4 + 6) + body[4:8] + b"answer")  # size, correlation id, payload
            await writer.drain()
        writer.close()

    class Owner:
        peer = "test"

        def __init__(self) -> None:
            self.ready = asyncio.Event()

        def relay_responses_ready(self) -> None:
            self.ready.set()

        def relay_blocked_changed(self) -> None:
            pass

        def relay_failed(self, reason: str, detail: str) -> None:
            raise AssertionError(f"{reason}: {detail}")

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = BufferPool(1 << 20, 16_384, 1_000)
    counters, owner = RelayCounters(), Owner()
    link = UpstreamLink(owner, pool, 1, "127.0.0.1", port, 1 << 20, counters)
    link.connect()
    request = struct.pack(">ihhi", 2 + 2 + 4, 18, 0, 7)  # size, api key, version, correlation id 7
    pending = link.send(request, 7, expects_response=True)
    await asyncio.wait_for(owner.ready.wait(), 10)
    assert pending is not None and bytes(pending.frame) == struct.pack(">ii", 10, 7) + b"answer"

    class Relay:  # what MetricsObserver.watch_relay reads of coordinator.relay.relay.Relay
        pass

    relay = Relay()
    relay.counters, relay.pool = counters, pool  # type: ignore[attr-defined]
    reader = InMemoryMetricReader()
    telemetry = start_telemetry(env={}, metric_readers=[reader])
    try:
        MetricsObserver(telemetry.meter_provider.get_meter("test")).watch_relay(relay)
        data = reader.get_metrics_data()
    finally:
        telemetry.shutdown()
        link.close()
        server.close()
        await server.wait_closed()
    points = {m.name: m.data.data_points for rm in data.resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics}
    assert [p.value for p in points["coordinator.relay.requests"]] == [1]
    by_direction = {p.attributes["direction"]: p.value for p in points["coordinator.relay.bytes"]}
    assert by_direction == {"to_upstream": len(request), "from_upstream": 14}
    assert [p.value for p in points["coordinator.relay.buffer.available"]] == [pool.available_bytes]
    assert [p.value for p in points["coordinator.relay.buffer.waiters"]] == [0]


def test_acl_age_count_and_refusals_are_exported() -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from coordinator.security.acl_cache import AclCache
    from coordinator.security.authorizer import Acl, Acls, Authorizer, Operation, PatternType, Permission, ResourceType
    from coordinator.telemetry.metrics import MetricsObserver

    authorizer = Authorizer()
    cache = AclCache("127.0.0.1:1", authorizer)
    reader = InMemoryMetricReader()
    telemetry = start_telemetry(env={}, metric_readers=[reader])
    try:
        MetricsObserver(telemetry.meter_provider.get_meter("test")).watch_acls(cache)
        before = reader.get_metrics_data()
        authorizer.use(Acls([Acl(ResourceType.GROUP, "app", PatternType.LITERAL, "User:alice", "*", Operation.READ,
                                 Permission.ALLOW)]))
        cache.loaded_at = time.monotonic() - 2.0  # read two seconds ago
        assert not authorizer.allows("User:bob", "10.0.0.1", Operation.READ, ResourceType.GROUP, "app")
        data = reader.get_metrics_data()
    finally:
        telemetry.shutdown()

    def points(metrics: Any) -> dict[str, Any]:
        return {m.name: m.data.data_points for rm in metrics.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics}

    assert "coordinator.acls.age" not in points(before)  # nothing read yet: no age to report
    now = points(data)
    assert [p.value for p in now["coordinator.acls.age"]][0] >= 2000
    assert [(p.value, p.attributes["enforcing"]) for p in now["coordinator.acls.count"]] == [(1, True)]
    assert [p.value for p in now["coordinator.acls.refused"]] == [1]
