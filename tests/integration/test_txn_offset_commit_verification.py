"""TxnOffsetCommit whose transaction does not hold the group's offsets partition, or whose producer is stale, sent
by hand to the coordinator (relay on) and to Kafka 4.1.1 directly, on a TV2 and a TV1 broker: the same answers.
Kafka's group coordinator has the transaction verified (v0-4) or its partition added (v5) by the transaction
coordinator before it looks at the group (KIP-890), so a transaction error wins over a group error, and a v5
request the group refuses leaves the offsets partition in the transaction."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.server.handlers.txn_verification import read_described_transaction
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from tests.support.eos_loop import loaded_coordinator
from tests.support.service import unique
from tests.support.transactions_wire import (Producer, connect, create_topic, end_transaction, init_producer,
                                             txn_offset_commit)
from tests.support.wire import join, request

pytestmark = pytest.mark.integration

VERSIONS = (0, 3, 4, 5)  # v1-2 are v0's as to these checks (no member), v3 brought the member
INSTANCE_VERSIONS = range(3, 6)  # the versions carrying group.instance.id
_DESCRIBE_TRANSACTIONS = 65
_LONG_SESSION_MS = 120_000  # the static members' sessions outlast the test


async def _transaction_coordinator(bootstrap_client: KafkaClient) -> KafkaClient:
    """Broker 1 as the bootstrap's metadata names it (ours: the relay's listener for it)."""
    metadata = await bootstrap_client.request(request(ApiKey.METADATA, 12, topics=None,
                                                      allow_auto_topic_creation=False,
                                                      include_topic_authorized_operations=False))
    [(host, port)] = [(b.host, int(b.port)) for b in metadata.brokers if int(b.node_id) == 1]
    return await KafkaClient.connect(host, port, client_id="txn-verify", timeout_ms=30_000)


async def _add_offsets(tc: KafkaClient, producer: Producer, group: str) -> None:
    added = await tc.request(request(ApiKey.ADD_OFFSETS_TO_TXN, 3, transactional_id=producer.transactional_id,
                                     producer_id=producer.producer_id, producer_epoch=producer.epoch,
                                     group_id=group))
    assert int(added.error_code) == 0, added


async def _fenced_static_member(client: KafkaClient, group: str, topic: str) -> tuple[str, str]:
    """A static member replaced by a new join of its group.instance.id: (instance id, the old member id)."""
    instance = unique("static")
    deadline = asyncio.get_running_loop().time() + 60
    while True:  # a fresh broker creates its offsets topic at a lookup and loads it: NOT_COORDINATOR meanwhile
        await client.request(request(ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=(group,)))
        first = await join(client, group, group_instance_id=instance, topics=(topic,),
                           session_timeout_ms=_LONG_SESSION_MS, rebalance_timeout_ms=_LONG_SESSION_MS)
        if int(first.error_code) not in (Errors.NOT_COORDINATOR, Errors.COORDINATOR_LOAD_IN_PROGRESS):
            break
        assert asyncio.get_running_loop().time() < deadline, first
        await asyncio.sleep(0.2)
    assert int(first.error_code) == 0, first
    second = await join(client, group, group_instance_id=instance, topics=(topic,),
                           session_timeout_ms=_LONG_SESSION_MS, rebalance_timeout_ms=_LONG_SESSION_MS)
    assert int(second.error_code) == 0 and second.member_id != first.member_id, second
    return instance, str(first.member_id)


async def _transaction_state(tc: KafkaClient, transactional_id: str) -> str:
    """The transaction's state and how many partitions it holds (DescribeTransactions read by hand: kio refuses
    the start time -1 of a transaction not begun)."""
    frame = await tc.send(request(_DESCRIBE_TRANSACTIONS, 0, transactional_ids=(transactional_id,)), raw=True)
    code, described = read_described_transaction(frame)
    assert code == Errors.NONE and described is not None, code
    return f"{described.state} with {len(described.partitions)} partition(s)"


async def answers(bootstrap: str, kafka: str) -> dict[str, str]:
    """Each case's answer (its one partition's error name) at each version."""
    topic = unique("txn-verify-in")
    create_topic(kafka, topic)
    host, port = bootstrap.rsplit(":", 1)
    client = await KafkaClient.connect(host, int(port), client_id="txn-verify", timeout_ms=30_000)
    tc = await _transaction_coordinator(client)
    found: dict[str, str] = {}

    async def case(name: str, version: int, producer: Producer, group: str, *, generation: int = -1,
                   member: str = "", instance: str | None = None) -> None:
        [error] = (await txn_offset_commit(client, version, producer, group, {(topic, 0): 5}, generation=generation,
                                           member=member, instance=instance)).values()
        found[f"{name} v{version}"] = error.name

    try:
        static_group = unique("txn-verify-static")
        instance, old_member = await _fenced_static_member(client, static_group, topic)
        for version in VERSIONS:
            producer = await init_producer(tc, unique("txn-verify"))
            # nothing of the group in the transaction (no AddOffsetsToTxn): a simple group, then a group error
            await case("not-added", version, producer, unique("txn-verify-simple"))
            await case("not-added-generation", version, producer, unique("txn-verify-gen"), generation=5,
                       member="m")
            if version in INSTANCE_VERSIONS:
                await case("not-added-fenced-member", version, producer, static_group, generation=1,
                           member=old_member, instance=instance)
            await end_transaction(tc, producer, commit=False, version=4)
            # an unknown producer id, a group error too
            stranger = Producer(unique("txn-verify-none"), producer.producer_id + 1_000_000, 0)
            await case("unknown-producer-generation", version, stranger, unique("txn-verify-gen"), generation=5,
                       member="m")
            # the transaction holds the group, but the producer's epoch is old; and a group error
            fresh = await init_producer(tc, unique("txn-verify"))
            group = unique("txn-verify-stale")
            await _add_offsets(tc, fresh, group)
            stale = Producer(fresh.transactional_id, fresh.producer_id, fresh.epoch - 1 if fresh.epoch else 5)
            await case("stale-epoch-generation", version, stale, group, generation=5, member="m")
            await case("stale-epoch", version, stale, group)
            await end_transaction(tc, fresh, commit=False, version=4)
            # a request the group refuses: Kafka's v5 verification has added the offsets partition all the same
            refused = await init_producer(tc, unique("txn-verify"))
            await case("refused", version, refused, unique("txn-verify-gen"), generation=5, member="m")
            found[f"refused-transaction v{version}"] = await _transaction_state(tc, refused.transactional_id)
            for end_version in (5, 4):  # a partition added as brokers add it ends as a TV2 transaction
                if await end_transaction(tc, refused, commit=False, version=end_version) == Errors.NONE:
                    break
    finally:
        await tc.close()
        await client.close()
    return found


@pytest.mark.parametrize("cluster", ["kafka_bootstrap", "kafka_tv1"])
async def test_an_unverified_transaction_is_answered_as_by_kafka(cluster: str,
                                                                 request: pytest.FixtureRequest) -> None:
    kafka = request.getfixturevalue(cluster)
    theirs = await answers(kafka, kafka)
    async with loaded_coordinator(kafka) as running:
        ours = await answers(f"127.0.0.1:{running.port}", kafka)
        log_text = running.log_text()
    # what Kafka 4.1.1 answered: the transaction's error before the group's (v0-2 carry no member to refuse)
    for version in range(3, 5):
        unverified = "INVALID_TXN_STATE" if version < 4 else "TRANSACTION_ABORTABLE"
        assert theirs[f"not-added-generation v{version}"] == unverified, theirs
        assert theirs[f"not-added-fenced-member v{version}"] == unverified, theirs
    for version in range(3, 6):
        assert theirs[f"unknown-producer-generation v{version}"] == "INVALID_PRODUCER_ID_MAPPING", theirs
        assert theirs[f"stale-epoch-generation v{version}"] == "INVALID_PRODUCER_EPOCH", theirs
    assert theirs["not-added-generation v5"] == "ILLEGAL_GENERATION", theirs  # v5 adds the partition first
    assert theirs["not-added-fenced-member v5"] == "FENCED_INSTANCE_ID", theirs
    assert [theirs[f"refused-transaction v{version}"] for version in VERSIONS] == \
        ["Empty with 0 partition(s)"] * 3 + ["Ongoing with 1 partition(s)"], theirs
    assert ours == theirs
    assert "event=txn_verification" not in log_text  # every verification was answered
