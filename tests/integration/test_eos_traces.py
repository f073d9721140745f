"""A client transaction's offsets in the real Jaeger (OTLP export by the OTEL_* variables): confluent-kafka's
`send_offsets_to_transaction` through the coordinator, one transaction committed and one aborted; each has a span
"TxnOffsetCommit transaction" with its transactional id, producer id and group, the event "pending" when the
offsets were written, then "committed" or "aborted" when the transaction coordinator's marker settled them."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest

from coordinator.embedded.jaeger import EmbeddedJaeger
from coordinator.telemetry.txn_tracing import OUTCOME, SPAN_NAME, TRANSACTIONAL_ID
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from tests.support.eos_loop import OpenTransaction, loaded_coordinator, open_transaction, stable_offset
from tests.support.service import unique

pytestmark = pytest.mark.integration


def _transaction_spans(jaeger: EmbeddedJaeger, service_name: str) -> dict[str, dict[str, Any]]:
    """transactional id -> its span (tags and events flattened)."""
    query = urllib.parse.urlencode({"service": service_name, "operation": SPAN_NAME, "lookback": "1h",
                                    "limit": "20"})
    try:
        with urllib.request.urlopen(f"{jaeger.query_url}/api/traces?{query}", timeout=10) as response:
            traces = json.load(response)["data"]
    except OSError:
        return {}
    spans = {}
    for span in (s for trace in traces for s in trace["spans"] if s["operationName"] == SPAN_NAME):
        tags = {t["key"]: t["value"] for t in span["tags"]}
        events = [{f["key"]: f["value"] for f in log["fields"]} for log in span["logs"]]
        spans[tags[TRANSACTIONAL_ID]] = {"tags": tags, "events": events}
    return spans


async def _settled(port: int, group: str, txn: OpenTransaction) -> tuple[int, Errors]:
    client = await KafkaClient.connect("127.0.0.1", port, client_id="eos-traces", timeout_ms=30_000)
    try:
        deadline = time.monotonic() + 60
        while (answer := await stable_offset(client, group, txn.source))[1] == Errors.UNSTABLE_OFFSET_COMMIT:
            assert time.monotonic() < deadline, "never settled"
            await asyncio.sleep(0.05)
        return answer
    finally:
        await client.close()


async def test_a_transactions_offsets_span_goes_pending_then_committed_or_aborted(
        jaeger: EmbeddedJaeger, kafka_bootstrap: str) -> None:
    service_name = unique("coordinator-eos")
    otel = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{jaeger.otlp_http_endpoint}/v1/traces",
            "OTEL_SERVICE_NAME": service_name, "OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_METRICS_EXPORTER": "none"}
    groups = {True: unique("eos-traced"), False: unique("eos-traced")}
    async with loaded_coordinator(kafka_bootstrap, extra_env=otel) as running:
        bootstrap = f"127.0.0.1:{running.port}"
        ids = {}
        for commit, group in groups.items():
            txn = await asyncio.to_thread(open_transaction, bootstrap, kafka_bootstrap, group)
            try:
                await asyncio.to_thread(txn.producer.commit_transaction if commit else txn.producer.abort_transaction,
                                        60)
                assert await _settled(running.port, group, txn) == ((txn.offset if commit else -1), Errors.NONE)
            finally:
                await asyncio.to_thread(txn.close)
            ids[commit] = txn.transactional_id
        assert await running.terminate() == 0  # flushes the spans
    deadline = time.monotonic() + 60
    while len(spans := await asyncio.to_thread(_transaction_spans, jaeger, service_name)) < 2:
        assert time.monotonic() < deadline, f"the transaction spans never reached Jaeger: {spans}"
        await asyncio.sleep(0.3)
    for commit, outcome in ((True, "committed"), (False, "aborted")):
        span = spans[ids[commit]]
        assert span["tags"][OUTCOME] == outcome, span
        assert span["tags"]["messaging.consumer.group.name"] == groups[commit], span
        assert [event["event"] for event in span["events"]] == ["pending", outcome], span
        assert span["events"][0]["coordinator.partitions"] == 1, span
