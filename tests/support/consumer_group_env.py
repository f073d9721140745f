"""The consumer group protocol (KIP-848) through the runtime on a manual clock: the environment the unit tests of
coordinator/group/modern share (an in-memory store, two topics, heartbeats as a v1 client sends them)."""

from __future__ import annotations

import asyncio
import uuid

from coordinator.config import CoordinatorConfig
from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.timer import ManualClock, SystemTimer
from coordinator.topics import StaticTopics, TopicImage

FOO = uuid.UUID(int=0xF00)
BAR = uuid.UUID(int=0xBA2)
SESSION_MS = 45_000
GROUP = "g"
JOIN_TOPICS = object()
# A heartbeat's answer comes within a few loop turns (manual clock, in-memory store): one that never comes fails
# the test after this long (wall clock), saying which, instead of hanging it until the phase's deadline.
ANSWER_WITHIN_S = 20.0


class Env:
    def __init__(self, **config: int) -> None:
        self.clock = ManualClock(1_000_000)
        self.timer = SystemTimer("test", clock=self.clock, executor=lambda fn: fn())
        self.config = CoordinatorConfig(**config)
        self.store = InMemoryGroupStore()
        self.runtime = GroupRuntime(self.config, self.timer, self.store, self.clock)
        self.topics = StaticTopics([TopicImage(FOO, "foo", 6), TopicImage(BAR, "bar", 3)])
        self.runtime.consumer_groups.topics = self.topics
        self._seen = 0

    async def close(self) -> None:
        await self.runtime.shutdown()
        await self.timer.close()

    @property
    def records(self) -> list:
        """The consumer group records written to the store since the last clear_records()."""
        return self.store.consumer_records[self._seen:]

    def clear_records(self) -> None:
        self._seen = len(self.store.consumer_records)

    async def heartbeat(self, member_id: str, epoch: int, owned: dict[uuid.UUID, tuple[int, ...]] | None = None,
                        topics: tuple[str, ...] | None | object = JOIN_TOPICS, **fields) -> HeartbeatResponse:
        """A join (epoch 0) subscribes to foo unless `topics` says otherwise; other heartbeats send no names."""
        if topics is JOIN_TOPICS:
            topics = ("foo",) if epoch == 0 else None
        if epoch == 0:
            fields.setdefault("rebalance_timeout_ms", 30_000)
            owned = {} if owned is None else owned
        request = HeartbeatRequest(GROUP, member_id, epoch, subscribed_topic_names=topics,
                                   owned=None if owned is None else list(owned.items()), client_id=member_id,
                                   client_host="/127.0.0.1", **fields)
        try:
            async with asyncio.timeout(ANSWER_WITHIN_S):
                return await self.runtime.consumer_group_heartbeat(request)
        except TimeoutError:
            raise AssertionError(f"the heartbeat of {member_id} (epoch {epoch}) got no answer within "
                                 f"{ANSWER_WITHIN_S:g} s") from None

    async def resolved(self) -> None:
        """Regular expression resolutions under way are done and their records written."""
        await self.runtime.consumer_groups.drain()
        for _ in range(5):
            await asyncio.sleep(0)

    def group(self):  # type: ignore[no-untyped-def]
        return self.runtime.shard_for(GROUP).consumer_groups.get(GROUP)

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.timer.advance_clock()
