"""The span of a client transaction's offsets (OpenTelemetry's SDK, spans kept in memory): one span per producer
id from its first pending TxnOffsetCommit to its marker, an event per step, the outcome; bounded."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from coordinator.telemetry.txn_tracing import OUTCOME, SPAN_NAME, TRANSACTIONAL_ID, TxnOffsetsTracer


def _tracer(capacity: int = 10) -> tuple[TxnOffsetsTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return TxnOffsetsTracer(provider.get_tracer("test"), capacity), exporter


def test_pending_commits_then_the_marker_end_one_span() -> None:
    tracer, exporter = _tracer()
    tracer.on_txn_offsets_pending("g", "app-1", 7, 0, 2)
    tracer.on_txn_offsets_pending("g", "app-1", 7, 0, 1)
    assert exporter.get_finished_spans() == ()
    tracer.on_txn_offsets_settled(7, 1, False, 0)
    [span] = exporter.get_finished_spans()
    assert span.name == SPAN_NAME and span.attributes is not None
    assert span.attributes[TRANSACTIONAL_ID] == "app-1" and span.attributes[OUTCOME] == "aborted"
    assert [event.name for event in span.events] == ["pending", "pending", "aborted"]
    tracer.on_txn_offsets_settled(7, 1, True, 3)  # nothing open for it any more
    tracer.on_txn_offsets_settled(8, 0, True, 3)  # loaded pending after a restart: no span here
    assert len(exporter.get_finished_spans()) == 1


def test_spans_past_the_capacity_end_unknown_oldest_first() -> None:
    tracer, exporter = _tracer(capacity=2)
    for producer_id in (1, 2, 3):
        tracer.on_txn_offsets_pending("g", f"app-{producer_id}", producer_id, 0, 1)
    [oldest] = exporter.get_finished_spans()
    assert oldest.attributes is not None
    assert oldest.attributes[TRANSACTIONAL_ID] == "app-1" and oldest.attributes[OUTCOME] == "unknown"
    tracer.on_txn_offsets_settled(3, 0, True, 1)
    assert [s.attributes[OUTCOME] for s in exporter.get_finished_spans() if s.attributes] == ["unknown", "committed"]
