"""A real exactly-once client (confluent-kafka: consume, produce, `send_offsets_to_transaction`) through the
coordinator while the coordinator dies between TxnOffsetCommit and EndTxn: SIGKILLed and restarted on the same
ports, or, with two instances, the group's owner killed and the other taking its state partition over. The offsets
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


async def _pending_then_settled(owner: Instance, group: str, txn: OpenTransaction, commit: bool) -> None:
    """At `owner`: pending once loaded; then the client ends the transaction and the marker settles it."""
    client = await KafkaClient.connect(*owner.address, client_id="eos-failover", timeout_ms=30_000)
    try:
        deadline = time.monotonic() + SETTLE_S
        # loading after the kill: NOT_COORDINATOR / LOAD_IN_PROGRESS until the partition is this process's
        while (answer := await stable_offset(client, group, txn.source))[1] != Errors.UNSTABLE_OFFSET_COMMIT:
            assert answer[0] == -1, answer  # never the offset before the marker
            assert time.monotonic() < deadline, f"never pending at {owner.instance_id}: {answer}"
            await asyncio.sleep(0.1)
        end = txn.producer.commit_transaction if commit else txn.producer.abort_transaction
        await asyncio.to_thread(end, 60)
        while (answer := await stable_offset(client, group, txn.source))[1] == Errors.UNSTABLE_OFFSET_COMMIT:
            assert time.monotonic() < deadline, "the marker never settled the pending offsets"
            await asyncio.sleep(0.05)
        assert answer == ((txn.offset if commit else -1), Errors.NONE)
    finally:
        await client.close()


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
            await _pending_then_settled(only, group, txn, commit)
        finally:
            await asyncio.to_thread(txn.close)
    expected = [f"out-{i}" for i in range(PER_TRANSACTION)] if commit else []
    assert await asyncio.to_thread(_output, kafka_bootstrap, txn, commit) == expected


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
async def test_the_groups_owner_killed_and_the_other_instance_takes_over(kafka_bootstrap: str, commit: bool) -> None:
    """The TxnOffsetCommit went to the group's owner, which is SIGKILLed; the other instance takes the state
    partition over (the instances' session), loads the offsets pending, and the marker settles them there."""
    group = unique("eos-failover")
    async with Instances(kafka_bootstrap, 2, relay=True) as cluster:
        ownership = await cluster.ownership()
        [owner] = [i for i in cluster if cluster.partition_of(group) in ownership.of(i.instance_id)]
        [other] = [i for i in cluster if i is not owner]
        # bootstrapped to the instance that survives: its relay carries the transaction coordinator's connection
        # (librdkafka keeps its TxnCoordinator at the address it first had for the broker's node id, even once
        # Metadata names another one, so it could not follow the broker to another instance's listener)
        txn = await asyncio.to_thread(open_transaction, other.bootstrap, kafka_bootstrap, group)
        try:
            assert f"event=txn_offsets_pending group={group}" in owner.log_text()
            await owner.kill()
            await cluster.until_settled([other.instance_id])
            await _pending_then_settled(other, group, txn, commit)
        finally:
            await asyncio.to_thread(txn.close)
    expected = [f"out-{i}" for i in range(PER_TRANSACTION)] if commit else []
    assert await asyncio.to_thread(_output, kafka_bootstrap, txn, commit) == expected
