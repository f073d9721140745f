"""A client transaction's offsets on the event topic, read back with a real consumer: TxnOffsetCommit v5 by hand
through the coordinator (the transaction driven at the embedded broker), one transaction committed and one
aborted; each TxnOffsetCommit is told `txn_offsets_pending`, each marker `txn_offsets_committed`/`_aborted`, with
the transactional id, producer id and epoch, the partition count and the time the offsets were pending."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from coordinator.telemetry.event_schema import problem_of
from protocol.error_codes import Errors
from tests.support.eos_loop import stable_offset
from tests.support.event_topic import read_events
from tests.support.service import FAST, service, unique, until_loaded
from tests.support.transactions_wire import (connect, create_topic, end_transaction, init_producer,
                                             txn_offset_commit, wait_state)

pytestmark = pytest.mark.integration

READ_BACK_WITHIN_S = 60


async def _until_stable(client: Any, group: str, topic: str, wanted: int) -> None:
    deadline = time.monotonic() + 30
    while (answer := await stable_offset(client, group, topic)) != (wanted, Errors.NONE):
        assert time.monotonic() < deadline, answer
        await asyncio.sleep(0.05)


async def test_a_transactions_offsets_are_told_on_the_event_topic(kafka_bootstrap: str) -> None:
    event_topic, group, topic = unique("__events"), unique("eos-events"), unique("eos-events-in")
    create_topic(kafka_bootstrap, topic, partitions=2)
    async with service(kafka_bootstrap, unique("__state"), *FAST, relay=True, event_topic=event_topic) as running:
        us, kafka = await running.client(), await connect(kafka_bootstrap)
        try:
            await until_loaded(us, group)
            producer = await init_producer(kafka, unique("eos-events-app"))
            first_epoch = producer.epoch
            committed = {(topic, 0): 10, (topic, 1): 4}
            assert set((await txn_offset_commit(us, 5, producer, group, committed)).values()) == {Errors.NONE}
            assert await end_transaction(kafka, producer, commit=True) == 0
            await wait_state(kafka, producer.transactional_id, "CompleteCommit")
            await _until_stable(us, group, topic, 10)
            second_epoch = producer.epoch  # TV2 bumped it at EndTxn
            assert await txn_offset_commit(us, 5, producer, group, {(topic, 0): 20}) == {(topic, 0): Errors.NONE}
            assert await end_transaction(kafka, producer, commit=False) == 0
            await wait_state(kafka, producer.transactional_id, "CompleteAbort")
            await _until_stable(us, group, topic, 10)
        finally:
            await us.close()
            await kafka.close()

        def settled_twice(events: list[dict[str, Any]]) -> bool:
            return sum(e["type"] in ("txn_offsets_committed", "txn_offsets_aborted") for e in events) == 2

        events = await asyncio.to_thread(read_events, kafka_bootstrap, event_topic, group, settled_twice,
                                         READ_BACK_WITHIN_S)
    txn_events = [e for e in events if e["type"].startswith("txn_")]
    assert [(e["type"], e["outcome"], e["transactional_id"], e["producer_id"], e["producer_epoch"],
             e["partition_count"]) for e in txn_events] == [
        ("txn_offsets_pending", "pending", producer.transactional_id, producer.producer_id, first_epoch, 2),
        # the marker carries the epoch TV2 bumped to at EndTxn
        ("txn_offsets_committed", "committed", producer.transactional_id, producer.producer_id, second_epoch, 2),
        ("txn_offsets_pending", "pending", producer.transactional_id, producer.producer_id, second_epoch, 1),
        ("txn_offsets_aborted", "aborted", producer.transactional_id, producer.producer_id, producer.epoch, 1),
    ], txn_events
    for event in txn_events:
        assert problem_of(event) is None, event
    for pending, settled in (txn_events[0:2], txn_events[2:4]):
        assert 0 <= settled["duration_ms"] <= settled["ts_ms"] - pending["ts_ms"] + 1_000, (pending, settled)
