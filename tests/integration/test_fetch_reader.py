"""protocol/fetch_reader.py against the embedded broker: a transaction's data batch and its marker read back
with every header field, read_uncommitted (an open transaction's batch is there, past the last stable offset)."""

from __future__ import annotations

import uuid

import pytest

from protocol.fetch_reader import MarkerType, fetch
from tests.support.transactions_wire import (
    add_partitions, batch, connect, create_topic, end_transaction, init_producer, produce, wait_state)

pytestmark = pytest.mark.integration


async def test_batches_and_markers_read_back_with_their_header_fields(kafka_bootstrap: str) -> None:
    topic = f"fetch-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic)
    client = await connect(kafka_bootstrap)
    try:
        producer = await init_producer(client, f"{topic}-app")
        assert await add_partitions(client, producer, topic, 0) == 0
        assert await produce(client, producer, topic, 0, batch(producer, 0, (b"k0", b"v0"), (None, b"v1"))) == (0, 0)
        opened = await fetch(client, topic, 0, 0)
        assert opened.high_watermark == 2 and opened.last_stable_offset == 0  # open: held below the batch
        [data] = opened.batches
        assert (data.base_offset, data.last_offset, data.producer_id, data.producer_epoch, data.base_sequence,
                data.is_transactional, data.is_control, data.marker) == (
            0, 1, producer.producer_id, producer.epoch, 0, True, False, None)
        assert [(r.offset, r.key, r.value) for r in data.records] == [(0, b"k0", b"v0"), (1, None, b"v1")]
        epoch = producer.epoch
        assert await end_transaction(client, producer, commit=False) == 0
        await wait_state(client, producer.transactional_id, "CompleteAbort")
        after = await fetch(client, topic, 0, opened.next_offset)
        [marker] = after.batches
        assert (marker.base_offset, marker.is_control, marker.is_transactional, marker.marker, marker.records,
                marker.producer_id) == (2, True, True, MarkerType.ABORT, (), producer.producer_id)
        assert marker.producer_epoch >= epoch
        assert after.next_offset == 3 and after.last_stable_offset == 3
        assert (await fetch(client, topic, 0, 3)).batches == []
    finally:
        await client.close()
