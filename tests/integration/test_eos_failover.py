"""A real exactly-once client (confluent-kafka: consume, produce, `send_offsets_to_transaction`) through the
coordinator while the coordinator dies between TxnOffsetCommit and EndTxn: SIGKILLed and restarted on the same
ports, or, with two instances, the group's owner killed and the other taking its state partition over (the
killed one started again before the client ends its transaction: see that test). The offsets
are pending in our state partition, so the new process loads them pending (UNSTABLE_OFFSET_COMMIT, nothing visible
early); the client then ends its transaction and the transaction coordinator's marker settles them: committed
offsets visible, aborted ones never. Then a chaos loop: transactions of one producer while the coordinator is
SIGKILLed at every point of a transaction, the group's offset checked after each."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from protocol.client import KafkaClient
from protocol.error_codes import Errors
from tests.support.eos_loop import (PER_TRANSACTION, RECORDS, OpenTransaction, open_transaction, produce_input,
                                    read_all, read_committed_consumer, stable_offset, take,
                                    transactional_producer)
from tests.support.transactions_wire import create_topic
from tests.support.instances import Instance, Instances, unique

pytestmark = pytest.mark.integration

SETTLE_S = 60


async def _answer_at(instance: Instance, group: str, txn: OpenTransaction) -> tuple[int, Errors]:
    client = await KafkaClient.connect(*instance.address, client_id="eos-failover", timeout_ms=30_000)
    try:
        return await stable_offset(client, group, txn.source)
    finally:
        await client.close()


async def _until_pending(instance: Instance, group: str, txn: OpenTransaction) -> None:
    """Loading after the kill (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS), then pending: never the offset."""
    deadline = time.monotonic() + SETTLE_S
    while (answer := await _answer_at(instance, group, txn))[1] != Errors.UNSTABLE_OFFSET_COMMIT:
        assert answer[0] == -1, answer
        assert time.monotonic() < deadline, f"never pending at {instance.instance_id}: {answer}"
        await asyncio.sleep(0.1)


async def _end_and_settle(instances: list[Instance], group: str, txn: OpenTransaction, commit: bool) -> None:
    """The client ends its transaction; the marker settles the offsets where the group is served."""
    end = txn.producer.commit_transaction if commit else txn.producer.abort_transaction
    await asyncio.to_thread(end, 60)
    deadline = time.monotonic() + SETTLE_S
    while True:
        answers = [await _answer_at(instance, group, txn) for instance in instances]
        settled = [answer for answer in answers if answer[1] == Errors.NONE]
        if settled:
            assert settled == [((txn.offset if commit else -1), Errors.NONE)], answers
            return
        assert time.monotonic() < deadline, f"the marker never settled the pending offsets: {answers}"
        await asyncio.sleep(0.1)


def _output(kafka: str, txn: OpenTransaction, commit: bool) -> list[str]:
    return read_all(kafka, txn.sink, "read_committed", PER_TRANSACTION if commit else 0)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
async def test_a_coordinator_sigkilled_between_txn_offset_commit_and_end_txn(kafka_bootstrap: str,
                                                                             commit: bool) -> None:
    group = unique("eos-kill")
    async with Instances(kafka_bootstrap, 1, relay=True, partitions=3, multi=False) as cluster:
        [only] = list(cluster)
        txn = await asyncio.to_thread(open_transaction, only.bootstrap, kafka_bootstrap, group)
        try:
            assert f"event=txn_offsets_pending group={group}" in only.log_text()
            await only.kill()
            await cluster.restart(only.instance_id)
            await _until_pending(only, group, txn)
            await _end_and_settle([only], group, txn, commit)
        finally:
            await asyncio.to_thread(txn.close)
    expected = [f"out-{i}" for i in range(PER_TRANSACTION)] if commit else []
    assert await asyncio.to_thread(_output, kafka_bootstrap, txn, commit) == expected


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
async def test_the_groups_owner_killed_and_the_other_instance_takes_over(kafka_bootstrap: str, commit: bool) -> None:
    """The TxnOffsetCommit went to the group's owner, which is SIGKILLed; the other instance takes the state
    partition over (the instances' session) and loads the offsets pending. The killed instance is then started
    again on its ports before the client ends its transaction: librdkafka keeps its TxnCoordinator at the address
    it had for the broker's node id when it found the coordinator (`rd_kafka_txn_coord_set` sees the same broker
    and changes nothing), and each instance's relay names broker 1 by its own listener, so a producer that had
    found its coordinator through the killed instance reaches it again only there. The marker then settles the
    offsets wherever the group is served by then."""
    group = unique("eos-failover")
    async with Instances(kafka_bootstrap, 2, relay=True) as cluster:
        ownership = await cluster.ownership()
        [owner] = [i for i in cluster if cluster.partition_of(group) in ownership.of(i.instance_id)]
        [other] = [i for i in cluster if i is not owner]
        txn = await asyncio.to_thread(open_transaction, cluster.bootstrap, kafka_bootstrap, group)
        try:
            assert f"event=txn_offsets_pending group={group}" in owner.log_text()
            await owner.kill()
            await cluster.until_settled([other.instance_id])
            await _until_pending(other, group, txn)
            await cluster.restart(owner.instance_id)
            await _end_and_settle([owner, other], group, txn, commit)
        finally:
            await asyncio.to_thread(txn.close)
    expected = [f"out-{i}" for i in range(PER_TRANSACTION)] if commit else []
    assert await asyncio.to_thread(_output, kafka_bootstrap, txn, commit) == expected


# ------------------------------------------------------------------------------------------------ chaos

# librdkafka (2.16) decommissions every learned broker when all of its brokers are down at once (a re-bootstrap),
# and its group-coordinator cache keeps the decommissioned handle of our node: the next send_offsets_to_transaction
# waits for that handle to come up, which it never does (confluentinc/librdkafka#5511, open). Every broker of a
# client of one instance is that instance, so each SIGKILL is such an outage; without re-bootstrap the learned
# handles reconnect to the same ports and the lookup recovers (docs/architecture.md, "Exactly-once and coordinator
# restarts").
NO_REBOOTSTRAP = {"metadata.recovery.strategy": "none"}
CALL_S = 30  # each transactional call's own timeout; a call that has not returned by then is stranded
# transaction index -> where the coordinator is SIGKILLed and restarted: before the transaction begins, after its
# records are produced (before AddOffsetsToTxn/TxnOffsetCommit), after its offsets are sent (before EndTxn)
CHAOS_KILLS = {1: "before_begin", 2: "before_offsets", 3: "before_end"}
CHAOS_ABORTED = {3, 5}  # aborted (the first with the coordinator killed before its abort), then done again


async def _call(what: str, function: Callable[..., Any], *args: Any) -> Any:
    """A blocking client call in a daemon thread, bounded: a stranded librdkafka call fails the test instead of
    holding the event loop's executor (and the test process) forever."""
    outcome: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # the test gave up on it
            try:
                outcome.set_result(function(*args))
            except BaseException as exc:  # handed to the test as it is
                outcome.set_exception(exc)

    threading.Thread(target=run, name=f"eos-chaos-{what}", daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.wrap_future(outcome), CALL_S + 15)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what} never returned (its own timeout is {CALL_S} s): the client is stranded")


async def _settled(instance: Instance, group: str, topic: str) -> int:
    """The group's offset once loaded and nothing pending: loading and pending answers never show an offset."""
    async def settled() -> int | None:
        client = await KafkaClient.connect(*instance.address, client_id="eos-chaos", timeout_ms=30_000)
        try:
            offset, code = await stable_offset(client, group, topic)
        finally:
            await client.close()
        if code == Errors.NONE:
            return offset
        assert offset == -1, (offset, code)
        return None

    deadline = time.monotonic() + SETTLE_S
    while (offset := await settled()) is None:
        assert time.monotonic() < deadline, "the group's offsets never settled"
        await asyncio.sleep(0.1)
    return offset


async def test_transactions_through_coordinator_sigkills(kafka_bootstrap: str) -> None:
    """A consume-transform-produce loop (confluent-kafka) through one instance SIGKILLed and restarted on its ports
    at every point of a transaction. After each transaction the group's offset is the last committed
    transaction's (a committed one never lost, an aborted one never visible), and the output read_committed is
    every record exactly once."""
    group = unique("eos-chaos")
    source, sink = unique("eos-in"), unique("eos-out")
    create_topic(kafka_bootstrap, source)
    create_topic(kafka_bootstrap, sink)
    await asyncio.to_thread(produce_input, kafka_bootstrap, source)
    async with Instances(kafka_bootstrap, 1, relay=True, partitions=3, multi=False) as cluster:
        [only] = list(cluster)
        kills: list[tuple[int, str]] = []

        async def bounce(at: str, index: int) -> None:
            await only.kill()
            await cluster.restart(only.instance_id)
            kills.append((index, at))

        consumer = read_committed_consumer(only.bootstrap, group)
        producer = await _call("init_transactions", lambda: transactional_producer(only.bootstrap,
                                                                                   unique("eos-app"), **NO_REBOOTSTRAP))
        committed, done, index = -1, 0, 0
        try:
            consumer.assign([TopicPartition(source, 0)])
            while done < RECORDS:
                kill_at, abort = CHAOS_KILLS.get(index), index in CHAOS_ABORTED
                if kill_at == "before_begin":
                    await bounce(kill_at, index)
                batch = await _call("poll", take, consumer, PER_TRANSACTION)
                producer.begin_transaction()
                for message in batch:
                    value = message.value().decode()
                    producer.produce(sink, value=f"{'aborted' if abort else 'out'}-{value}".encode(), partition=0)
                assert await _call("flush", producer.flush, CALL_S) == 0
                if kill_at == "before_offsets":
                    await bounce(kill_at, index)
                await _call("send_offsets_to_transaction", producer.send_offsets_to_transaction,
                            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), CALL_S)
                if kill_at == "before_end":
                    await bounce(kill_at, index)
                if abort:
                    await _call("abort_transaction", producer.abort_transaction, CALL_S)
                    consumer.seek(TopicPartition(source, 0, batch[0].offset()))
                else:
                    await _call("commit_transaction", producer.commit_transaction, CALL_S)
                    committed = batch[-1].offset() + 1
                    done += len(batch)
                assert await _settled(only, group, source) == committed, (index, "aborted" if abort else "committed")
                index += 1
        finally:
            consumer.close()
            await _call("close", producer.flush, 10)
        assert [at for _, at in kills] == [CHAOS_KILLS[i] for i in sorted(CHAOS_KILLS)]
    assert await asyncio.to_thread(read_all, kafka_bootstrap, sink, "read_committed", RECORDS) == \
        [f"out-{i}" for i in range(RECORDS)]
