"""What the coordinator knows of the cluster's topics: partition counts, learned from every Metadata answer that
passes through the relay and refreshed on a miss. OffsetCommit checks it the way Kafka's KafkaApis checks its
metadata cache before the group coordinator sees the request (UNKNOWN_TOPIC_OR_PARTITION otherwise)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

log = logging.getLogger("coordinator.relay")

Refresh = Callable[[list[str]], Awaitable[Any]]


class ClusterMetadata:
    def __init__(self, refresh: Refresh, min_interval_ms: int) -> None:
        self._refresh = refresh
        self._min_interval_s = min_interval_ms / 1000
        self._partitions: dict[str, int] = {}  # topic -> partition count
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self._refreshed_at: dict[str, float] = {}

    def partition_count(self, topic: str) -> int | None:
        return self._partitions.get(topic)

    def contains(self, topic: str, partition: int) -> bool:
        count = self._partitions.get(topic)
        return count is not None and 0 <= partition < count

    def observe(self, metadata: Any, *, all_topics: bool) -> None:
        """Learn from a Metadata answer (an answer for all topics also forgets deleted ones)."""
        seen = {}
        for topic in metadata.topics or ():
            if topic.name is None:
                continue
            if int(topic.error_code) == 0:
                seen[topic.name] = len(topic.partitions)
            elif int(topic.error_code) == 3:  # UNKNOWN_TOPIC_OR_PARTITION
                self._partitions.pop(topic.name, None)
        if all_topics:
            self._partitions = seen
        else:
            self._partitions.update(seen)

    async def missing(self, partitions: Iterable[tuple[str, int]]) -> set[tuple[str, int]]:
        """The partitions the cluster does not have, after one refresh of the topics not known to have them."""
        wanted = set(partitions)
        unknown = {tp for tp in wanted if not self.contains(*tp)}
        if not unknown:
            return set()
        await self._refresh_topics(sorted({topic for topic, _ in unknown}))
        return {tp for tp in unknown if not self.contains(*tp)}

    async def _refresh_topics(self, topics: list[str]) -> None:
        """One Metadata request for the topics; concurrent misses share it, and a topic refreshed within the
        last min interval is not asked for again (a client retrying a bad commit cannot flood the cluster)."""
        now = time.monotonic()
        waits = [self._inflight[t] for t in topics if t in self._inflight]
        fresh = [t for t in topics if t not in self._inflight
                 and now - self._refreshed_at.get(t, -1e9) >= self._min_interval_s]
        if fresh:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            for topic in fresh:
                self._inflight[topic] = future
            try:
                response = await self._refresh(fresh)
                self.observe(response, all_topics=False)
                future.set_result(None)
            except Exception as exc:
                future.set_exception(exc)
                future.exception()  # marks it retrieved: other waiters get it, or nobody
                raise
            finally:
                for topic in fresh:
                    self._inflight.pop(topic, None)
                    self._refreshed_at[topic] = time.monotonic()
        for wait in waits:
            await asyncio.shield(wait)
