"""A real exactly-once client (confluent-kafka: consume, produce, `send_offsets_to_transaction`) through the
coordinator while the coordinator dies between TxnOffsetCommit and EndTxn: SIGKILLed and restarted on the same
ports, or, with two instances, the group's owner killed and the other taking its state partition over (the
killed one started again before the client ends its transaction: see that test). The offsets
are pending in our state partition, so the new process loads them pending (UNSTABLE_OFFSET_COMMIT, nothing visible
early); the client then ends its transaction and the transaction coordinator's marker settles them: committed
offsets visible, aborted ones never."""

from __future__ import annotations

import asyncio
import time

import pytest

from protocol.client import KafkaClient
from protocol.error_codes import Errors
from tests.support.eos_loop import (PER_TRANSACTION, OpenTransaction, open_transaction, read_all,
                                    stable_offset)
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
