"""Stored timestamps are calendar time (epoch ms), as in Kafka, while deadlines run on the monotonic clock:
a commit time or state-change time read back after a restart, on another host, or by Kafka's own tools must
still mean the same instant."""

from __future__ import annotations

import time

from coordinator.config import CoordinatorConfig
from coordinator.group.api import OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.timer import MonotonicClock, SystemTimer


def _epoch_ms() -> int:
    return time.time_ns() // 1_000_000


async def test_commit_and_state_timestamps_are_epoch_ms_with_the_production_clock() -> None:
    timer = SystemTimer("wall-clock-test", MonotonicClock())
    store = InMemoryGroupStore()
    coordinator = GroupRuntime(CoordinatorConfig(), timer, store)
    before = _epoch_ms()
    response = await coordinator.commit_offsets(OffsetCommitRequest(
        group_id="simple", generation_id=-1, member_id="",
        topics=[OffsetCommitRequestTopic("t", [OffsetCommitRequestPartition(0, 42)])], retention_time_ms=60_000,
        version=2))
    after = _epoch_ms()
    assert response.topics[0].partitions[0].error_code == 0
    record = store.offsets["simple"][("t", 0)]
    assert before <= record.commit_timestamp_ms <= after
    assert record.expire_timestamp_ms == record.commit_timestamp_ms + 60_000
    group = coordinator.groups["simple"]
    assert before <= group.current_state_timestamp_ms <= after
    # the monotonic clock's origin is boot time: far from the epoch, so this could not pass by accident
    assert abs(MonotonicClock().now_ms() - before) > 10**9
    await coordinator.shutdown()
    await timer.close()
