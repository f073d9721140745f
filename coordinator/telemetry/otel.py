"""The OpenTelemetry SDK, configured from the standard `OTEL_*` environment variables.

Tracing is on when `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, `console`) or, unset, when an OTLP endpoint
is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`): a coordinator with no
collector in sight does not try to export every few seconds. `OTEL_SDK_DISABLED=true` turns everything off.
The OTLP protocol is `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL` (`http/protobuf`,
the default, or `grpc`); the exporters read their own endpoint, headers, timeout and compression variables.
Metrics work the same with `OTEL_METRICS_EXPORTER`, plus a Prometheus scrape endpoint when `--metrics-listen`
is given. The service name is `coordinator` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` says
otherwise. Spans go through a batch processor; `shutdown()` flushes both pipelines.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter


log = logging.getLogger("coordinator.telemetry")

DEFAULT_SERVICE_NAME = "coordinator"
_HTTP, _GRPC = "http/protobuf", "grpc"


class TelemetryConfigError(ValueError):
    """An OTEL_* variable names something we cannot provide."""


@dataclass
class Telemetry:
    """The SDK providers in use; None where that signal is off."""

    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    metrics_server: Any = None  # prometheus_client's WSGI server, when --metrics-listen is given
    metrics_address: tuple[str, int] | None = None
    describe: list[str] = field(default_factory=list)  # one human line per configured pipeline

    @property
    def tracing(self) -> bool:
        return self.tracer_provider is not None

    def shutdown(self) -> None:
        """Flush and stop; blocking (call from a worker thread in async code)."""
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()


def resource(env: Mapping[str, str] | None = None) -> Resource:
    """OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME (which wins) read from `env`; service name `coordinator`
    when neither names one."""
    env = os.environ if env is None else env
    attributes: dict[str, str] = {}
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = urllib.parse.unquote(value.strip())
    attributes["service.name"] = (env.get("OTEL_SERVICE_NAME") or attributes.get("service.name")
                                  or DEFAULT_SERVICE_NAME)
    return Resource.create(attributes)


def start_telemetry(metrics_listen: tuple[str, int] | None = None, env: Mapping[str, str] | None = None,
                    trace_exporter: SpanExporter | None = None,
                    metric_readers: list[MetricReader] | None = None) -> Telemetry:
    """Build what the environment asks for. `trace_exporter`/`metric_readers` override the environment
    (tests and benchmarks)."""
    env = os.environ if env is None else env
    telemetry = Telemetry()
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        telemetry.describe.append("OpenTelemetry disabled (OTEL_SDK_DISABLED=true)")
        return telemetry
    res = resource(env)
    exporter = trace_exporter or _trace_exporter(env, telemetry.describe)
    if exporter is not None:
        # sampler: OTEL_TRACES_SAMPLER(_ARG); limits: OTEL_SPAN_*_LIMIT
        telemetry.tracer_provider = TracerProvider(resource=res)
        telemetry.tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    readers = list(metric_readers or _metric_readers(env, telemetry.describe))
    if metrics_listen is not None:
        readers.append(_start_prometheus(telemetry, metrics_listen))
    if readers:
        telemetry.meter_provider = MeterProvider(resource=res, metric_readers=readers)
    return telemetry


def _wanted(env: Mapping[str, str], signal: str) -> list[str]:
    """The exporters OTEL_<SIGNAL>_EXPORTER names; unset means OTLP when an endpoint is configured."""
    named = env.get(f"OTEL_{signal}_EXPORTER")
    if named is not None:
        return [n.strip().lower() for n in named.split(",") if n.strip() and n.strip().lower() != "none"]
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    return ["otlp"] if endpoint else []


def _protocol(env: Mapping[str, str], signal: str) -> str:
    protocol = (env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or _HTTP).strip().lower()
    if protocol not in (_HTTP, _GRPC):
        raise TelemetryConfigError(f"OTLP protocol {protocol!r} is not supported (use {_HTTP} or {_GRPC})")
    return protocol


def _endpoint(env: Mapping[str, str], signal: str, protocol: str) -> str | None:
    """The OTLP endpoint from `env` (the exporters would read os.environ themselves): the signal's own as given,
    else the base one, with `/v1/<signal>` appended for HTTP as the specification says."""
    own = env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    if own:
        return own
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not base or protocol == _GRPC:
        return base or None
    return f"{base.rstrip('/')}/v1/{signal.lower()}"


def _trace_exporter(env: Mapping[str, str], describe: list[str]) -> SpanExporter | None:
    names = _wanted(env, "TRACES")
    if not names:
        return None
    if len(names) > 1:
        raise TelemetryConfigError(f"OTEL_TRACES_EXPORTER: one exporter please, got {names}")
    name = names[0]
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        describe.append("traces: console")
        return ConsoleSpanExporter()
    if name != "otlp":
        raise TelemetryConfigError(f"OTEL_TRACES_EXPORTER={name!r} is not supported (otlp, console or none)")
    protocol = _protocol(env, "TRACES")
    endpoint = _endpoint(env, "TRACES", protocol)
    if protocol == _GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
        describe.append("traces: OTLP/gRPC")
        return GrpcSpanExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    describe.append("traces: OTLP/HTTP")
    return OTLPSpanExporter(endpoint=endpoint)


def _metric_readers(env: Mapping[str, str], describe: list[str]) -> list[MetricReader]:
    readers: list[MetricReader] = []
    for name in _wanted(env, "METRICS"):
        if name == "prometheus":  # served by --metrics-listen; the variable alone opens no port
            continue
        if name == "console":
            from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
            readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
            describe.append("metrics: console")
        elif name == "otlp":
            protocol = _protocol(env, "METRICS")
            endpoint = _endpoint(env, "METRICS", protocol)
            if protocol == _GRPC:
                from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as Grpc
                # interval: OTEL_METRIC_EXPORT_INTERVAL
                readers.append(PeriodicExportingMetricReader(Grpc(endpoint=endpoint)))
                describe.append("metrics: OTLP/gRPC")
            else:
                from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
                readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint)))
                describe.append("metrics: OTLP/HTTP")
        else:
            raise TelemetryConfigError(f"OTEL_METRICS_EXPORTER={name!r} is not supported "
                                       "(otlp, console, prometheus or none)")
    return readers


def _start_prometheus(telemetry: Telemetry, listen: tuple[str, int]) -> MetricReader:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=True)  # ours only: no process/platform collectors of other code
    reader = PrometheusMetricReader(registry=registry)
    host, port = listen
    server, _thread = start_http_server(port, addr=host, registry=registry)
    telemetry.metrics_server = server
    telemetry.metrics_address = (host, server.server_address[1])
    telemetry.describe.append(f"metrics: Prometheus at http://{host}:{telemetry.metrics_address[1]}/metrics")
    return reader
