"""native_transactions.py: a request's answer reaches the transaction that waits for it one loop turn after it
arrives (awaited directly, not through asyncio.wait_for's waiter: on a loop a thousand members keep busy, each of a
transaction's three round trips paid a turn more), and an answer that is not there by the write's deadline is
given up as unanswered (the outcome unknown), as before."""

from __future__ import annotations

import asyncio
import datetime

import pytest
from confluent_kafka import KafkaError
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i64

from coordinator.storage.native_transactions import NativeTransactionalProducer, _Failed
from protocol import apis, codec
from protocol.messages import build

END_TXN, VERSION = 26, 3


def producer() -> NativeTransactionalProducer:
    """Not started: nothing is connected (only `_answer` is used)."""
    return NativeTransactionalProducer("state", {"bootstrap.servers": "127.0.0.1:9"}, "state-0", "tid-0", 5_000)


def end_txn() -> object:
    return build(apis.request_class(END_TXN, VERSION), transactional_id="tid-0", producer_id=i64(1),
                 producer_epoch=i16(0), committed=True)


def answer_frame(correlation_id: int = 7) -> bytes:
    body = build(apis.response_class(END_TXN, VERSION), throttle_time=datetime.timedelta(0), error_code=ErrorCode.none)
    framed = codec.encode_response_frame(correlation_id, apis.response_header_version(END_TXN, VERSION), body)
    return framed[4:]  # as the client hands a raw answer over: correlation id first


async def test_an_answer_reaches_its_transaction_one_loop_turn_after_it_arrives() -> None:
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[bytes] = loop.create_future()
    reading = asyncio.ensure_future(producer()._answer(end_txn(), answer, loop.time() + 5, "EndTxn"))
    await asyncio.sleep(0)  # it waits for the answer
    answer.set_result(answer_frame())
    await asyncio.sleep(0)  # one loop turn
    assert reading.done()
    assert int(reading.result().error_code) == 0


async def test_an_answer_not_there_by_the_deadline_is_given_up_as_unanswered() -> None:
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[bytes] = loop.create_future()
    with pytest.raises(_Failed) as failed:
        await producer()._answer(end_txn(), answer, loop.time() + 0.01, "EndTxn")
    assert failed.value.error.code() == KafkaError._MSG_TIMED_OUT and failed.value.then == "reinit"
    assert answer.done()  # a late answer is dropped: the client settles only futures not done
