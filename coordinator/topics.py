"""What the coordinator knows of the cluster's topics: ids, names, partition counts and the racks of each partition's
replicas (what Kafka's metadata image gives its group coordinator).
The consumer group logic reads them through `TopicsView`; the relay's view of the cluster (relay/cluster.py),
refreshed from Metadata answers, is the one the service gives it."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class TopicImage:
    topic_id: uuid.UUID
    name: str
    partitions: int
    # per partition, the racks of its replicas' brokers in replica order (a broker without a rack adds none);
    # partitions past the end have none, so () is a cluster without racks
    racks: tuple[tuple[str, ...], ...] = ()

    def partition_racks(self, partition: int) -> tuple[str, ...]:
        return self.racks[partition] if partition < len(self.racks) else ()


class TopicsView(Protocol):
    def by_name(self, name: str) -> TopicImage | None: ...
    def by_id(self, topic_id: uuid.UUID) -> TopicImage | None: ...
    def names(self) -> Iterable[str]: ...  # every topic known (regular expressions are resolved against them)
    @property
    def version(self) -> int: ...  # grows whenever a topic is created (regular expressions are resolved again)


class StaticTopics:
    """A fixed set of topics (unit tests, and a coordinator without a cluster behind it: no topics)."""

    def __init__(self, topics: Iterable[TopicImage] = ()) -> None:
        self._by_name = {t.name: t for t in topics}
        self._by_id = {t.topic_id: t for t in self._by_name.values()}
        self.version = 0

    def put(self, topic: TopicImage) -> None:
        old = self._by_name.pop(topic.name, None)
        if old is not None:
            self._by_id.pop(old.topic_id, None)
        else:
            self.version += 1
        self._by_name[topic.name] = topic
        self._by_id[topic.topic_id] = topic

    def names(self) -> Iterable[str]:
        return self._by_name.keys()

    def by_name(self, name: str) -> TopicImage | None:
        return self._by_name.get(name)

    def by_id(self, topic_id: uuid.UUID) -> TopicImage | None:
        return self._by_id.get(topic_id)
