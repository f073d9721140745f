"""The state topic's broker goes away: writes fail within the commit timeout with Kafka's errors, nothing hangs,
no acknowledged write is lost, and the same store works again once the broker is back — through the idempotent
producer and through the transactional one (whose timed-out commit retires the producer; a fresh one is
initialised in the background while later writes keep failing in time)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from coordinator.embedded import EmbeddedKafka
from coordinator.group.errors import group_append_error, offset_append_error
from protocol.error_codes import Errors
from coordinator.group.store import StoreError
from coordinator.group.records import GroupRecord, MemberRecord, OffsetRecord
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore, loaded_group_records, loaded_offset_records
from tests.support.machine import LoopLateness

pytestmark = pytest.mark.integration

COMMIT_TIMEOUT_MS = 2_000
# librdkafka checks message timeouts about once a second (a write fails up to 1 s after its timeout by design);
# the rest is a loaded machine's. Below 5 s, the default commit timeout: a timeout that was not applied fails it
# (and a write failed by the producer's safety net instead of librdkafka's timeout is caught by its log line)
FAILED_WITHIN_S = COMMIT_TIMEOUT_MS / 1000 + 2.9


def group(generation: int) -> GroupRecord:
    member = MemberRecord("m-1", None, "client", "/127.0.0.1", 30_000, 10_000, b"sub", b"asg-%d" % generation)
    return GroupRecord("consumer", generation, "range", "m-1", generation, [member])


async def timed(coroutine) -> tuple[float, BaseException | None]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        await coroutine
    except StoreError as exc:
        return loop.time() - started, exc
    return loop.time() - started, None


@pytest.mark.parametrize("transactional,state_writer", [(False, "librdkafka"), (True, "librdkafka"),
                                                     (True, "native")],
                         ids=["idempotent", "transactional", "native-transactional"])
async def test_writes_fail_in_time_while_the_broker_is_down_and_recover_after(
        restartable_kafka: EmbeddedKafka, transactional: bool, state_writer: str,
        caplog: pytest.LogCaptureFixture) -> None:
    topic = f"__state-{uuid.uuid4().hex[:8]}"
    config = StorageConfig(bootstrap=restartable_kafka.bootstrap, state_topic=topic, partitions=3,
                           event_topic=None, commit_timeout_ms=COMMIT_TIMEOUT_MS,
                           transactional_id=f"{topic}-writer" if transactional else None, state_writer=state_writer)
    store = KafkaGroupStore(config, load_timeout_ms=60_000)
    await store.start()
    try:
        await store.store_group("g", group(1))
        await store.store_offsets("g", {("t", 0): OffsetRecord(10, commit_timestamp_ms=1)})

        await restartable_kafka.stop()
        async with LoopLateness() as lost:  # what the process lost to the machine meanwhile: allowed on top
            results = await asyncio.gather(
                timed(store.store_group("g", group(2))),
                timed(store.store_offsets("g", {("t", 0): OffsetRecord(11, commit_timestamp_ms=2)})),
                *(timed(store.store_offsets(f"other-{i}", {("t", i): OffsetRecord(i, commit_timestamp_ms=2)}))
                  for i in range(20)))
        for elapsed_s, error in results:
            assert isinstance(error, StoreError)
            assert error.error == Errors.REQUEST_TIMED_OUT
            assert elapsed_s < FAILED_WITHIN_S + lost.max_ms / 1000, (elapsed_s, lost)
        # what the coordinator answers (3.9 mapping): SyncGroup retries the rebalance, OffsetCommit passes through
        assert group_append_error(results[0][1].error) == Errors.REBALANCE_IN_PROGRESS
        assert offset_append_error(results[1][1].error) == Errors.REQUEST_TIMED_OUT
        # later writes are not held up by the producer that failed (nor by re-initialising one)
        async with LoopLateness() as lost:
            later = await asyncio.gather(*(timed(store.store_offsets(
                f"later-{i}", {("t", i): OffsetRecord(i, commit_timestamp_ms=3)})) for i in range(5)))
        for elapsed_s, error in later:
            assert isinstance(error, StoreError) and error.error == Errors.REQUEST_TIMED_OUT
            assert elapsed_s < FAILED_WITHIN_S + lost.max_ms / 1000, (elapsed_s, lost)

        assert not [r for r in caplog.records if "delivery_report_missing" in r.getMessage()]

        await restartable_kafka.start()
        await retry_until_written(store.store_group("g", group(3)) for _ in range(30))
        await store.store_offsets("g", {("t", 0): OffsetRecord(12, commit_timestamp_ms=3)})
        state = await store.read()
    finally:
        await store.close()
    # acknowledged writes survive; a timed-out write may or may not have landed, but never overrides a later one
    assert loaded_group_records(state)["g"] == group(3)
    assert loaded_offset_records(state)["g"][("t", 0)].offset == 12


async def retry_until_written(attempts) -> None:
    """The first write after a restart may still time out while the producer reconnects."""
    last: StoreError | None = None
    for attempt in attempts:
        try:
            await attempt
            return
        except StoreError as exc:
            last = exc
    raise AssertionError(f"store never recovered: {last}")
