"""A failed store append leaves no reference cycle behind: under the collector's freeze policy (few full
collections) a cycle per failed write is memory held until the next full collection, and an outage fails
thousands. The cycle to avoid: the append's future → its StoreError → the traceback of the `await` that raised it
→ the awaiting frame → that future. Manual clock, in-memory store (tests/support/group_harness.py)."""

from __future__ import annotations

import gc

from coordinator.group.records import GroupMetadataRecord, GroupRecord
from coordinator.group.store import InMemoryGroupStore, StoreError
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore
from protocol.error_codes import Errors
from tests.support.graphs import unreachable_cycles
from tests.support.group_harness import Env, advance_until_joined, drain, env  # noqa: F401


def _cycles_through_store_errors() -> list[list[str]]:
    """The reference cycles the collector would free now that hold a StoreError."""
    return [sorted({type(o).__qualname__ for o in cycle}) for cycle in unreachable_cycles()
            if any(isinstance(o, StoreError) for o in cycle)]


async def test_a_failed_sync_write_leaves_no_cycle(env: Env) -> None:
    gc.collect()
    gc.disable()
    try:
        assert isinstance(env.store, InMemoryGroupStore)
        member = env.client("m")
        await member.start_join()
        await advance_until_joined(env, member)
        assert member.take_join().error_code == Errors.NONE
        env.store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
        await member.start_sync({member.member_id: b"assignment"})
        await drain()
        assert member.sync_task is not None and member.sync_task.done()
        assert member.sync_task.result().error_code == Errors.COORDINATOR_NOT_AVAILABLE
        del member
        assert _cycles_through_store_errors() == []
    finally:
        gc.enable()


async def test_a_refused_kafka_store_append_leaves_no_cycle() -> None:
    """The Kafka-backed store refuses an append before anything is sent (not started, or the partition not
    loaded): the refusal is raised and caught in the frame that holds the write's future, so it must be stored
    without that traceback. No broker needed: nothing is sent."""
    store = KafkaGroupStore(StorageConfig(bootstrap="127.0.0.1:9"))
    records = [GroupMetadataRecord("g", GroupRecord("consumer", 1, "range", "m"))]
    gc.collect()
    gc.disable()
    try:
        one = store.append(0, records)
        together = store.append_together(0, [records, records])
        for refused in (one, *together):
            error = refused.exception()
            assert isinstance(error, StoreError) and error.error == Errors.COORDINATOR_NOT_AVAILABLE
        del one, together, refused, error
        assert _cycles_through_store_errors() == []
    finally:
        gc.enable()
