"""DeliveryBatch: many delivery reports from librdkafka's poll thread become one result on the event loop;
StorageConfig's derived settings."""

from __future__ import annotations

import asyncio
import threading

import pytest
from confluent_kafka import KafkaError

from coordinator.storage.config import StorageConfig, min_insync_replicas
from coordinator.storage.producer import DeliveryBatch


async def test_resolves_once_all_reports_arrived_from_another_thread() -> None:
    batch = DeliveryBatch(asyncio.get_running_loop(), expected=1_000)
    workers = [threading.Thread(target=lambda: [batch.on_delivery(None, None) for _ in range(250)])
               for _ in range(4)]
    for worker in workers:
        worker.start()
    assert await asyncio.wait_for(batch.future, 5) is None
    for worker in workers:
        worker.join()


async def test_first_error_wins_and_result_waits_for_every_report() -> None:
    batch = DeliveryBatch(asyncio.get_running_loop(), expected=3)
    batch.on_delivery(None, None)
    batch.on_delivery(KafkaError(KafkaError.NOT_ENOUGH_REPLICAS), None)
    await asyncio.sleep(0)
    assert not batch.future.done()
    batch.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), None)
    error = await asyncio.wait_for(batch.future, 5)
    assert error.code() == KafkaError.NOT_ENOUGH_REPLICAS


async def test_refused_records_are_settled_in_bulk_and_force_resolve_is_idempotent() -> None:
    batch = DeliveryBatch(asyncio.get_running_loop(), expected=5)
    batch.on_delivery(None, None)
    batch.settle(4, KafkaError(KafkaError._QUEUE_FULL))
    assert (await asyncio.wait_for(batch.future, 5)).code() == KafkaError._QUEUE_FULL
    batch.force_resolve()
    assert batch.future.result().code() == KafkaError._QUEUE_FULL


@pytest.mark.parametrize(("replication_factor", "expected"), [(1, 1), (2, 1), (3, 2), (5, 2)])
def test_min_insync_replicas_tolerates_one_replica_down(replication_factor: int, expected: int) -> None:
    assert min_insync_replicas(replication_factor) == expected


def test_storage_config_rejects_impossible_settings() -> None:
    with pytest.raises(ValueError):
        StorageConfig(bootstrap="x", partitions=0)
    with pytest.raises(ValueError):
        StorageConfig(bootstrap="x", replication_factor=0)
    with pytest.raises(ValueError, match="transactional_id"):  # the partitions' ids are derived from it
        StorageConfig(bootstrap="x", partition_fencing=True)
    assert StorageConfig(bootstrap="x", transactional_id="c", partition_fencing=True).partition_fencing
    assert StorageConfig(bootstrap="x").state_topic == "__coordinator_state"
