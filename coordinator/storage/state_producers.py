"""Which writer the state topic gets, and its client settings: an idempotent producer (`AsyncProducer`), a pool
of transactional producers (`TransactionalWriters`, every write atomic), or with partition fencing one
transactional producer per owned partition (`PartitionTransactions`, created when the partition is loaded)."""

from __future__ import annotations

from typing import Any, Callable

from coordinator.security.clusters import secured
from coordinator.storage.config import StorageConfig
from coordinator.storage.partition_writers import PartitionTransactions, TransactionalWriters
from coordinator.storage.producer import AsyncProducer

StateProducer = AsyncProducer | TransactionalWriters | PartitionTransactions


def producer_settings(config: StorageConfig) -> dict[str, Any]:
    return secured({
        "bootstrap.servers": config.bootstrap,
        "client.id": f"{config.client_id}-state",
        "enable.idempotence": True,  # implies acks=all and in-order retries
        "acks": "all",
        "linger.ms": config.linger_ms,
        "message.timeout.ms": config.commit_timeout_ms,
        "request.timeout.ms": config.commit_timeout_ms,
        "compression.type": "none",  # offsets.topic.compression.codec = 0
        "queue.buffering.max.messages": 1_000_000,
        # one OffsetCommit (up to max_write_bytes) must not be split across produce requests by record count
        "batch.num.messages": 1_000_000,
        "socket.nagle.disable": True,  # small acks=all requests must not wait for delayed ACKs
    })


async def open_state_producer(config: StorageConfig, on_fenced: Callable[[int], None]) -> StateProducer:
    """The state topic's writer for `config`, started (a pool of transactional producers has registered its
    transactional ids). `on_fenced(partition)`: with partition fencing, a partition's producer was fenced."""
    if config.partition_fencing:
        assert config.transactional_id is not None  # StorageConfig checks it
        return PartitionTransactions(config.state_topic, producer_settings(config), "state-producer",
                                     config.transactional_id, config.commit_timeout_ms, on_fenced,
                                     state_writer=config.state_writer, markers_settle_ms=config.markers_settle_ms)
    if config.transactional_id is None:
        return AsyncProducer(config.state_topic, producer_settings(config), "state-producer")
    producer = TransactionalWriters(config.state_topic, producer_settings(config), "state-producer",
                                    config.transactional_id, config.commit_timeout_ms,
                                    config.transactional_producers, state_writer=config.state_writer,
                                    markers_settle_ms=config.markers_settle_ms)
    try:
        await producer.start(config.transactions_init_timeout_ms)
    except BaseException:
        await producer.close()
        raise
    return producer
