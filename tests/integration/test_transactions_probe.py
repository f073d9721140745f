"""What Kafka 4.1 does with a transactional batch of a client's producer appended from another connection (the
exactly-once design in docs/architecture.md rests on these facts; a Kafka upgrade that changes one fails here).
Two connections: `app` plays the application's producer, `us` plays the coordinator appending to its state
partition with the application's transactional id, producer id and epoch.

On the default embedded broker (`transaction.version` 2, KIP-890 part 2) and on one formatted with
`transaction.version=1` (the feature a cluster of older brokers or a pinned release has)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest

from protocol.client import KafkaClient
from protocol.fetch_reader import MarkerType, fetch
from tests.support.transactions_wire import (
    Producer, add_partitions, batch, connect, create_topic, end_transaction, init_producer, produce,
    transaction_state, wait_state)

pytestmark = pytest.mark.integration

NONE, OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, TRANSACTION_ABORTABLE = 0, 45, 47, 120
INVALID_TXN_STATE = 48


class Roles:
    def __init__(self, app: KafkaClient, us: KafkaClient, output: str, state: str) -> None:
        self.app, self.us, self.output, self.state = app, us, output, state


@pytest.fixture
async def roles(request: pytest.FixtureRequest) -> AsyncIterator[Roles]:
    bootstrap = request.getfixturevalue(request.param)
    name = uuid.uuid4().hex[:8]
    output, state = f"out-{name}", f"state-{name}"
    create_topic(bootstrap, output)
    create_topic(bootstrap, state)
    app, us = await connect(bootstrap), await connect(bootstrap)
    try:
        yield Roles(app, us, output, state)
    finally:
        await app.close()
        await us.close()


async def transaction_version(client: KafkaClient) -> int:
    answer = await client.request(ApiVersionsRequest(client_software_name="probe", client_software_version="1"))
    return {str(f.name): int(f.max_version_level) for f in answer.finalized_features}["transaction.version"]


async def open_transaction(roles: Roles, *, tv2: bool) -> Producer:
    """The application's transaction with one record in its output partition."""
    producer = await init_producer(roles.app, f"app-{uuid.uuid4().hex}")
    if not tv2:
        assert await add_partitions(roles.app, producer, roles.output, 0) == NONE
    assert (await produce(roles.app, producer, roles.output, 0, batch(producer, 0, (None, b"out")),
                          version=12 if tv2 else 11))[0] == NONE
    return producer


@pytest.mark.parametrize("roles", ["kafka_bootstrap"], indirect=True)
async def test_a_transaction_not_begun_is_described_empty(roles: Roles) -> None:
    producer = await init_producer(roles.app, f"app-{uuid.uuid4().hex}")  # its start time is -1 until it begins
    assert await transaction_state(roles.us, producer.transactional_id) == ("Empty", set())


@pytest.mark.parametrize("roles", ["kafka_bootstrap"], indirect=True)
async def test_a_produce_v11_to_a_partition_not_in_the_transaction_is_transaction_abortable(roles: Roles) -> None:
    producer = await open_transaction(roles, tv2=True)
    assert await produce(roles.us, producer, roles.state, 0, batch(producer, 0, (b"k", b"v"))) == (
        TRANSACTION_ABORTABLE, -1)


@pytest.mark.parametrize("roles", ["kafka_bootstrap"], indirect=True)
async def test_a_produce_v12_from_another_connection_adds_the_partition(roles: Roles) -> None:
    producer = await open_transaction(roles, tv2=True)
    assert await produce(roles.us, producer, roles.state, 0, batch(producer, 0, (b"k", b"v")), version=12) == (
        NONE, 0)
    state, partitions = await transaction_state(roles.us, producer.transactional_id)
    assert (state, partitions) == ("Ongoing", {(roles.output, 0), (roles.state, 0)})


@pytest.mark.parametrize("roles", ["kafka_bootstrap"], indirect=True)
async def test_sequences_first_above_zero_refused_duplicates_by_range_not_content(roles: Roles) -> None:
    producer = await open_transaction(roles, tv2=True)
    assert await produce(roles.us, producer, roles.state, 0, batch(producer, 5, (b"k", b"v5")), version=12) == (
        OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert (await fetch(roles.us, roles.state, 0, 0)).batches == []  # nothing accepted
    assert await produce(roles.us, producer, roles.state, 0, batch(producer, 0, (b"k", b"v0")), version=12) == (NONE, 0)
    assert await produce(roles.us, producer, roles.state, 0, batch(producer, 1, (b"k", b"v1")), version=12) == (NONE, 1)
    # the same sequence with other content: answered as the duplicate it is by range, the new content dropped
    assert await produce(roles.us, producer, roles.state, 0, batch(producer, 1, (b"k", b"other")),
                         version=12) == (NONE, 1)
    assert (await produce(roles.us, producer, roles.state, 0, batch(producer, 3, (b"k", b"v3")),
                          version=12))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert await produce(roles.us, producer, roles.state, 0, batch(producer, 2, (b"k", b"v2")), version=12) == (NONE, 2)
    assert await end_transaction(roles.app, producer, commit=True) == NONE
    await wait_state(roles.us, producer.transactional_id, "CompleteCommit")
    read = await fetch(roles.us, roles.state, 0, 0)
    assert [(b.base_sequence, [r.value for r in b.records]) for b in read.batches if not b.is_control] == [
        (0, [b"v0"]), (1, [b"v1"]), (2, [b"v2"])]
    assert [b.marker for b in read.batches if b.is_control] == [MarkerType.COMMIT]


@pytest.mark.parametrize("roles", ["kafka_bootstrap"], indirect=True)
async def test_tv2_bumps_the_epoch_at_every_end_and_the_old_epoch_is_refused(roles: Roles) -> None:
    assert await transaction_version(roles.us) == 2
    producer = await open_transaction(roles, tv2=True)
    first = producer.epoch
    assert await produce(roles.us, producer, roles.state, 0, batch(producer, 0, (b"k", b"v")), version=12) == (NONE, 0)
    assert await end_transaction(roles.app, producer, commit=True) == NONE
    assert producer.epoch == first + 1
    await wait_state(roles.us, producer.transactional_id, "CompleteCommit")
    for version in (11, 12):
        assert (await produce(roles.us, producer, roles.state, 0, batch(producer, 1, (b"k", b"late"), epoch=first),
                              version=version))[0] == INVALID_PRODUCER_EPOCH
    assert (await produce(roles.app, producer, roles.output, 0, batch(producer, 0, (None, b"next")),
                          version=12))[0] == NONE
    assert await end_transaction(roles.app, producer, commit=False) == NONE
    assert producer.epoch == first + 2


@pytest.mark.parametrize("roles", ["kafka_tv1"], indirect=True)
async def test_tv1_add_partitions_from_our_connection_then_produce_v11(roles: Roles) -> None:
    assert await transaction_version(roles.us) == 1
    producer = await open_transaction(roles, tv2=False)
    assert await add_partitions(roles.us, producer, roles.state, 0) == NONE
    assert await produce(roles.us, producer, roles.state, 0, batch(producer, 0, (b"k", b"v"))) == (NONE, 0)
    state, partitions = await transaction_state(roles.us, producer.transactional_id)
    assert (state, partitions) == ("Ongoing", {(roles.output, 0), (roles.state, 0)})
    epoch = producer.epoch
    assert await end_transaction(roles.app, producer, commit=True, version=4) == NONE
    assert producer.epoch == epoch  # TV1: no bump
    await wait_state(roles.us, producer.transactional_id, "CompleteCommit")
    # the transaction ended: a late append of the same producer and epoch is refused by verification alone
    code, offset = await produce(roles.us, producer, roles.state, 0, batch(producer, 1, (b"k", b"late")))
    assert (code, offset) == (TRANSACTION_ABORTABLE, -1)
    read = await fetch(roles.us, roles.state, 0, 0)
    assert [(b.is_control, b.marker) for b in read.batches] == [(False, None), (True, MarkerType.COMMIT)]
