"""A fenced transaction's writes are settled only after the fence is told (`on_fenced`, which makes the ownership stop
serving the partition), for both state writers (transactions.py's on librdkafka, native_transactions.py's). A write's
outcome is an Outcome (coordinator/storage/outcome.py): its caller hears of the failure in the very call that
settles it, so with the fence told second a caller could see NOT_COORDINATOR for a partition still served (the
librdkafka cases of tests/integration/test_storage_partition_fencing.py failed so). The writes queued behind the
transaction fail with the fence after it is told too."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from confluent_kafka import KafkaError
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from coordinator.storage.native_transactions import NativeTransactionalProducer, _per_partition
from coordinator.storage.outcome import Outcome
from coordinator.storage.transaction_queue import Queued
from coordinator.storage.transactions import TransactionalProducer
from protocol import apis, codec
from protocol.messages import build, item_class

PARTITION = 1
PRODUCE, PRODUCE_VERSION = 0, 9
PRODUCER_FENCED = 90
SETTINGS = {"bootstrap.servers": "127.0.0.1:9"}  # never connected: nothing here reaches a broker


def queued(order: list[Any], name: str) -> Queued:
    """A write queued for a transaction, as TransactionQueue.send queues it, that notes when it is settled."""
    outcome: Outcome[KafkaError | None] = Outcome()
    outcome.on_settled(lambda done: order.append((name, None if done.result() is None else done.result().code())))
    return [(PARTITION, b"key-" + name.encode(), b"value")], outcome, asyncio.get_running_loop().time() + 5, None


async def test_the_librdkafka_writer_tells_the_fence_before_it_settles_the_fenced_transactions_writes() -> None:
    order: list[Any] = []
    producer = TransactionalProducer("state", SETTINGS, "state-p1", "tid-p1", 5_000,
                                     on_fenced=lambda: order.append("fenced"), fatal_is_fence=True)
    batch = [queued(order, "a"), queued(order, "b")]
    producer._queue.append(queued(order, "behind"))  # sent while the transaction was being committed
    # what the serial thread hands the loop when a newer holder of the id fenced the transaction
    # (TransactionClient._failed)
    fence = KafkaError(KafkaError._FENCED, "fenced: Broker: Producer attempted an operation with an old epoch")
    producer._answer(batch, (fence, "fenced"))
    assert order == ["fenced", ("a", KafkaError._FENCED), ("b", KafkaError._FENCED),
                     ("behind", KafkaError._FENCED)]
    assert producer.fenced


def produce_request() -> Any:
    return build(apis.request_class(PRODUCE, PRODUCE_VERSION), transactional_id="tid-p1", acks=i16(-1),
                 timeout=datetime.timedelta(seconds=5), topic_data=())


def produce_answer(error_code: int) -> bytes:
    """A Produce answer for PARTITION, as the client hands a raw answer over (correlation id first)."""
    cls = apis.response_class(PRODUCE, PRODUCE_VERSION)
    topic = item_class(cls, "responses")
    partition = item_class(topic, "partition_responses")
    body = build(cls, throttle_time=datetime.timedelta(0), responses=(topic(name="state", partition_responses=(
        partition(index=i32(PARTITION), error_code=ErrorCode(error_code), base_offset=i64(-1),
                  record_errors=()),)),))
    framed = codec.encode_response_frame(7, apis.response_header_version(PRODUCE, PRODUCE_VERSION), body)
    return framed[4:]


async def test_the_native_writer_tells_the_fence_before_it_settles_the_fenced_transactions_writes() -> None:
    loop = asyncio.get_running_loop()
    order: list[Any] = []
    producer = NativeTransactionalProducer("state", SETTINGS, "state-p1", "tid-p1", 5_000,
                                           on_fenced=lambda: order.append("fenced"), fatal_is_fence=True)
    try:
        producer.producer_id, producer.epoch = 7, 0
        producer._added = {PARTITION}  # added to the transaction ahead (open_ahead): its Produce goes first
        batch = [queued(order, "a"), queued(order, "b")]
        producer._queue.append(queued(order, "behind"))
        per_partition = _per_partition(batch)
        answer: asyncio.Future[bytes] = loop.create_future()
        sent = (producer._batches(per_partition), {("127.0.0.1", 9): (produce_request(), answer)})
        transaction = asyncio.ensure_future(producer._transaction(batch, loop.time() + 5, per_partition, sent))
        await asyncio.sleep(0)  # it waits for the Produce's answer
        answer.set_result(produce_answer(PRODUCER_FENCED))  # a newer holder of the id bumped the epoch
        await asyncio.wait_for(transaction, 5)
        assert order == ["fenced", ("a", KafkaError._FENCED), ("b", KafkaError._FENCED),
                         ("behind", KafkaError._FENCED)]
        assert producer.fenced
    finally:
        await producer.close(0)
