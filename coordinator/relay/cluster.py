"""What the coordinator knows of the cluster's topics: ids, partition counts and their replicas' racks, learned
from every Metadata answer that passes through the relay and refreshed on a miss. OffsetCommit checks it the way
Kafka's KafkaApis checks its metadata cache before the group coordinator sees the request
(UNKNOWN_TOPIC_OR_PARTITION otherwise).

Racks are the brokers' as Kafka's metadata image has them: every registered broker's, fenced ones too (a consumer
group's metadata hash counts the rack of every replica's broker). Metadata answers list only unfenced brokers, so a
broker down since before this instance started is learnt from DescribeCluster v2 with IncludeFencedBrokers (Kafka
4.0+, KIP-1073): at the start, and again when a refreshed topic has a replica on a broker no answer has named."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from coordinator.topics import TopicImage

log = logging.getLogger("coordinator.relay")

Refresh = Callable[[list[str]], Awaitable[Any]]
# a DescribeCluster answer listing every registered broker, fenced ones too; None: the cluster cannot (before 4.0)
RegisteredBrokers = Callable[[], Awaitable[Any]]
_UNKNOWN = object()
_PRUNE_ABOVE = 1_024  # refresh times kept before the stale ones are dropped (names come from clients)


class ClusterMetadata:
    def __init__(self, refresh: Refresh, min_interval_ms: int,
                 refresh_all: Callable[[], Awaitable[Any]] | None = None, *,
                 registered_brokers: RegisteredBrokers | None = None) -> None:
        self._refresh = refresh
        self._refresh_all = refresh_all
        self._registered_brokers = registered_brokers
        self._brokers_listing: asyncio.Future[None] | None = None
        # replicas' brokers the cluster's list of registered brokers lacked when asked (unregistered): not asked again
        # until the next list
        self._unregistered: set[int] = set()
        self._said_unlisted = False
        self._min_interval_s = min_interval_ms / 1000
        self._all_refreshed_at = -1e9
        # grows whenever a topic is created (a new name, or a known name under a new id): regular expressions are
        # resolved again then, as Kafka's coordinator does for an image with created topics (not deleted ones)
        self.version = 0
        self._partitions: dict[str, int] = {}  # topic -> partition count
        self._ids: dict[str, uuid.UUID] = {}  # topic -> topic id (Metadata v10+)
        self._names: dict[uuid.UUID, str] = {}
        self._recreated = 0  # topics seen deleted and created again under their name
        self._partition_answers: dict[str, Any] = {}  # topic -> its partitions in the latest answer, as they came
        # broker -> rack, kept while a broker is absent from answers (Kafka's image keeps a fenced broker's)
        self._racks: dict[int, str | None] = {}
        self._racks_version = 0
        # topic -> (partitions answer, racks version, image) it was built from: the same image object while the
        # topic does not change (the group hash caches topic hashes by identity); racks are read only when a
        # group looks at the topic, not for every topic of every Metadata answer
        self._images: dict[str, tuple[Any, int, TopicImage]] = {}
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self._refreshed_at: dict[str, float] = {}

    def partition_count(self, topic: str) -> int | None:
        return self._partitions.get(topic)

    def contains(self, topic: str, partition: int) -> bool:
        count = self._partitions.get(topic)
        return count is not None and 0 <= partition < count

    def by_name(self, name: str) -> TopicImage | None:
        """The topic as the consumer group logic sees it (coordinator/topics.TopicsView)."""
        topic_id, count = self._ids.get(name), self._partitions.get(name)
        if topic_id is None or count is None:
            return None
        answer = self._partition_answers.get(name, ())
        cached = self._images.get(name)
        if cached is not None and cached[0] is answer and cached[1] == self._racks_version:
            return cached[2]
        image = TopicImage(topic_id, name, count, self._partition_racks(answer))
        if cached is not None and cached[2] == image:
            image = cached[2]
        self._images[name] = (answer, self._racks_version, image)
        return image

    def _partition_racks(self, partitions: Any) -> tuple[tuple[str, ...], ...]:
        """Per partition (by index), the racks of its replicas' brokers; () when none has one. At once when no broker
        has a rack (the usual cluster): a topic's image is made again after each of its refreshes, once a heartbeat
        interval while a group uses it, and the pass over a 2,000-partition topic took 1.1 ms of the loop's CPU."""
        if all(rack is None for rack in self._racks.values()):
            return ()
        replicas = {int(getattr(p, "partition_index", i)): getattr(p, "replica_nodes", ())
                    for i, p in enumerate(partitions)}
        racks = tuple(tuple(rack for rack in (self._racks.get(int(r)) for r in replicas.get(i, ())) if rack is not None)
                      for i in range(len(replicas)))
        return racks if any(racks) else ()

    def by_id(self, topic_id: uuid.UUID) -> TopicImage | None:
        name = self._names.get(topic_id)
        return None if name is None else self.by_name(name)

    def names(self) -> Iterable[str]:
        return list(self._partitions)

    async def refresh_all(self, max_age_ms: int) -> None:
        """Learn every topic of the cluster, unless that was done within `max_age_ms` (consumer groups resolve
        their regular expressions against them)."""
        if self._refresh_all is None or time.monotonic() - self._all_refreshed_at < max_age_ms / 1000:
            return
        self._all_refreshed_at = time.monotonic()
        self.observe(await self._refresh_all(), all_topics=True)

    def observe(self, metadata: Any, *, all_topics: bool) -> None:
        """Learn from a Metadata answer (an answer for all topics also forgets deleted ones)."""
        before, recreated = set(self._partitions), self._recreated
        self._observe(metadata, all_topics)
        if self._partitions.keys() - before or self._recreated != recreated:
            self.version += 1

    def _observe(self, metadata: Any, all_topics: bool) -> None:
        self._learn_racks(metadata)
        seen = {}
        for topic in metadata.topics or ():
            if topic.name is None:
                continue
            if int(topic.error_code) == 0:
                topic_id = getattr(topic, "topic_id", None)
                known = self._partitions.get(topic.name)
                if known is not None and len(topic.partitions) < known and self._is_known_id(topic.name, topic_id):
                    seen[topic.name] = known  # a lagging broker's answer: a topic never loses partitions in Kafka
                    continue
                seen[topic.name] = len(topic.partitions)
                self._learn_id(topic.name, topic_id)
                self._partition_answers[topic.name] = topic.partitions
            elif int(topic.error_code) == 3:  # UNKNOWN_TOPIC_OR_PARTITION
                self._partitions.pop(topic.name, None)
                self._forget_id(topic.name)
        if all_topics:
            for name in set(self._partitions) - set(seen):
                self._forget_id(name)
            self._partitions = seen
        else:
            self._partitions.update(seen)

    def _learn_racks(self, metadata: Any) -> None:
        """Brokers' racks (Metadata v1+; a v0 answer has none to tell)."""
        changed = False
        for broker in getattr(metadata, "brokers", None) or ():
            if hasattr(broker, "rack") and self._racks.get(int(broker.node_id), _UNKNOWN) != broker.rack:
                self._racks[int(broker.node_id)] = broker.rack
                self._unregistered.discard(int(broker.node_id))
                changed = True
        if changed:
            self._racks_version += 1

    async def learn_registered_brokers(self) -> None:
        """Every registered broker's rack, fenced or not, from the cluster's list of them (the racks become exactly
        that list's: an unregistered broker's goes, as it leaves Kafka's image). A cluster that cannot list fenced
        brokers, or an answer with an error, changes nothing; concurrent callers share one request."""
        if self._registered_brokers is None:
            return
        if self._brokers_listing is not None:
            return await asyncio.shield(self._brokers_listing)
        listing = self._brokers_listing = asyncio.get_running_loop().create_future()
        try:
            await _settling(listing, self._list_registered_brokers(self._registered_brokers))
        finally:
            self._brokers_listing = None

    async def _list_registered_brokers(self, registered_brokers: RegisteredBrokers) -> None:
        self.observe_registered_brokers(await registered_brokers())

    def observe_registered_brokers(self, answer: Any) -> None:
        """Learn from a DescribeCluster answer that includes fenced brokers (None: the cluster cannot give one)."""
        if answer is None:
            if not self._said_unlisted:
                self._said_unlisted = True
                log.info("event=registered_brokers_unlisted detail=the cluster cannot list fenced brokers (before "
                         "Kafka 4.0): a broker down since our start adds no rack to consumer groups' metadata hash")
            return
        if int(answer.error_code) != 0:
            log.warning("event=registered_brokers_unread error_code=%d message=%s", int(answer.error_code),
                        answer.error_message)
            return
        racks = {int(broker.broker_id): broker.rack for broker in answer.brokers}
        self._unregistered.clear()
        if racks != self._racks:
            self._racks = racks
            self._racks_version += 1

    async def _learn_brokers_of(self, topics: Iterable[str]) -> None:
        """The registered brokers listed again if a replica of `topics` is on a broker no answer has named (one
        down since before we started, or one registered since the last list and fenced since)."""
        if self._registered_brokers is None:
            return
        replicas: set[int] = set()
        for topic in topics:
            for partition in self._partition_answers.get(topic, ()):
                replicas.update(getattr(partition, "replica_nodes", ()))
        unseen = replicas - self._racks.keys() - self._unregistered
        if not unseen:
            return
        try:
            await self.learn_registered_brokers()
        except Exception as exc:  # the topics are served with the racks known; the next refresh asks again
            log.warning("event=registered_brokers_unread error=%r brokers=%s", exc, sorted(unseen))
            return
        self._unregistered.update(replicas - self._racks.keys())

    def _learn_id(self, name: str, topic_id: uuid.UUID | None) -> None:
        if topic_id is None or topic_id.int == 0:
            return
        old = self._ids.get(name)
        if old != topic_id:
            if old is not None:
                self._names.pop(old, None)  # deleted and re-created under the same name
                self._recreated += 1
            self._ids[name] = topic_id
            self._names[topic_id] = name

    def _is_known_id(self, name: str, topic_id: uuid.UUID | None) -> bool:
        """The answer names the topic we know by `name` (not one deleted and created again under it)."""
        return topic_id is not None and topic_id.int != 0 and self._ids.get(name) == topic_id

    def _forget_id(self, name: str) -> None:
        old = self._ids.pop(name, None)
        if old is not None:
            self._names.pop(old, None)
        self._partition_answers.pop(name, None)
        self._images.pop(name, None)

    def stale(self, topics: Iterable[str], max_age_ms: int) -> list[str]:
        """The topics not refreshed within `max_age_ms` (or never), sorted."""
        now = time.monotonic()
        return sorted({t for t in topics if now - self._refreshed_at.get(t, -1e9) >= max_age_ms / 1000})

    async def refresh(self, topics: Iterable[str], max_age_ms: int) -> None:
        """Ask the cluster about the topics not refreshed within `max_age_ms` (or never): a consumer group's
        subscribed topics, before its heartbeat is handled, so new topics and partitions are seen."""
        stale = self.stale(topics, max_age_ms)
        if stale:
            await self._refresh_topics(stale)

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
                await _settling(future, self._learn_topics(fresh))
            finally:
                for topic in fresh:
                    self._inflight.pop(topic, None)
                    self._refreshed_at[topic] = time.monotonic()
                self._prune_refresh_times()
        for wait in waits:
            await asyncio.shield(wait)

    async def _learn_topics(self, topics: list[str]) -> None:
        self.observe(await self._refresh(topics), all_topics=False)
        await self._learn_brokers_of(topics)

    def _prune_refresh_times(self) -> None:
        """Forget refresh times older than the min interval: they no longer hold a refresh back, and every topic
        name a client ever committed to (a typo, a fuzzer, a deleted topic) would otherwise stay for good."""
        if len(self._refreshed_at) > _PRUNE_ABOVE:
            now = time.monotonic()
            self._refreshed_at = {topic: at for topic, at in self._refreshed_at.items()
                                  if now - at < self._min_interval_s}


async def _settling(future: asyncio.Future[None], work: Awaitable[None]) -> None:
    """`work` done, and `future` (what concurrent callers wait on) settled as it ended: done, or its exception,
    raised here too."""
    try:
        await work
        future.set_result(None)
    except Exception as exc:
        future.set_exception(exc)
        future.exception()  # marks it retrieved: other waiters get it, or nobody
        raise
