"""Consumer groups (KIP-848) in the real state topic: the records a heartbeat writes are acknowledged by Kafka
before the answer, and a new runtime on the same topic loads the group back (epochs, members, targets) and
serves its members at their epochs."""

from __future__ import annotations

import uuid

import pytest

from coordinator.config import CoordinatorConfig
from protocol.error_codes import Errors
from coordinator.group.modern.heartbeat import HeartbeatRequest
from coordinator.topics import StaticTopics, TopicImage
from coordinator.group.runtime import GroupRuntime
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore
from coordinator.timer import ManualClock, SystemTimer
from tests.support.service import unique

pytestmark = pytest.mark.integration

PARTITIONS = 2
TOPIC = TopicImage(uuid.UUID(int=0xABC), "orders", 4)


class Coordinator:
    def __init__(self, store: KafkaGroupStore) -> None:
        self.store = store
        self.timer = SystemTimer("test", clock=ManualClock(1_000_000), executor=lambda fn: fn())
        self.runtime = GroupRuntime(CoordinatorConfig(offsets_topic_num_partitions=PARTITIONS), self.timer, store)
        self.runtime.consumer_groups.topics = StaticTopics([TOPIC])

    async def heartbeat(self, member_id: str, epoch: int, owned=None):  # type: ignore[no-untyped-def]
        join = epoch == 0
        return await self.runtime.consumer_group_heartbeat(HeartbeatRequest(
            "g", member_id, epoch, rebalance_timeout_ms=30_000 if join else -1,
            subscribed_topic_names=("orders",) if join else None, owned=[] if join else owned))

    async def close(self) -> None:
        await self.runtime.shutdown()
        await self.timer.close()
        await self.store.close()


async def start(config: StorageConfig) -> Coordinator:
    store = KafkaGroupStore(config, load_timeout_ms=60_000)
    await store.start()
    coordinator = Coordinator(store)
    await coordinator.runtime.load()
    return coordinator


async def test_a_consumer_group_survives_a_restart(kafka_bootstrap: str) -> None:
    config = StorageConfig(bootstrap=kafka_bootstrap, state_topic=unique("__kip848"), partitions=PARTITIONS,
                           event_topic=None, transactional_id=unique("kip848"))
    first = await start(config)
    try:
        a = await first.heartbeat("a", 0)
        b = await first.heartbeat("b", 0)
        assert (a.error, a.member_epoch, b.error, b.member_epoch) == (Errors.NONE, 1, Errors.NONE, 2)
        a = await first.heartbeat("a", 1, owned=[(TOPIC.topic_id, tuple(range(4)))])
        kept = a.assignment[TOPIC.topic_id]
        live = first.runtime.shard_for("g").consumer_groups["g"]
        expected = (live.group_epoch, live.assignment_epoch, dict(live.members), dict(live.targets))
    finally:
        await first.close()
    second = await start(config)
    try:
        loaded = second.runtime.shard_for("g").consumer_groups["g"]
        assert (loaded.group_epoch, loaded.assignment_epoch, loaded.members, loaded.targets) == expected
        a = await second.heartbeat("a", 1, owned=[(TOPIC.topic_id, kept)])  # a revoked: epoch 2 on the new one
        assert (a.error, a.member_epoch) == (Errors.NONE, 2)
        b = await second.heartbeat("b", 2, owned=[])
        assert (b.error, b.member_epoch, sorted(b.assignment[TOPIC.topic_id])) == (
            Errors.NONE, 2, sorted(set(range(4)) - set(kept)))
    finally:
        await second.close()
