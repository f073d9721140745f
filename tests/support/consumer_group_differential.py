"""The same ConsumerGroupHeartbeat/ConsumerGroupDescribe requests to Kafka's own coordinator and to ours, answers
compared as what a client acts on: error code and message, member id and epoch, heartbeat interval, assignment
presence and contents (as sets), and ConsumerGroupDescribe snapshots. Our coordinator relays to the same cluster,
so topic ids are the same on both sides."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from coordinator.group.modern.records import ConsumerGroupRecord, RegexRecord
from coordinator.storage.consumer_records import CONSUMER_GROUP_TYPES, decode, record_type_of
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from tests.support.instances import read_raw
from tests.support.polling import wait_until
from tests.support.wire import ms, nested, request

HEARTBEAT_VERSION = 1
_NOT_SERVING = {14, 15, 16}  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR
Owned = Mapping[uuid.UUID, tuple[int, ...]]


@dataclass(frozen=True)
class Answer:
    """A heartbeat answer, reduced to what a client acts on."""

    error: int
    message: str | None
    member_id: str | None
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: frozenset[tuple[uuid.UUID, frozenset[int]]] | None

    def owned(self) -> dict[uuid.UUID, tuple[int, ...]]:
        return {topic_id: tuple(sorted(ps)) for topic_id, ps in self.assignment or ()}


def _partitions(assignment: Any) -> frozenset[tuple[uuid.UUID, frozenset[int]]]:
    return frozenset((t.topic_id, frozenset(t.partitions)) for t in assignment.topic_partitions if t.partitions)


def answer_of(response: Any) -> Answer:
    return Answer(int(response.error_code), response.error_message, response.member_id, int(response.member_epoch),
                  int(response.heartbeat_interval.total_seconds() * 1000),
                  None if response.assignment is None else _partitions(response.assignment))


def snapshot_of(group: Any) -> tuple[Any, ...]:
    """A ConsumerGroupDescribe group, members by id, assignments as sets (authorized operations not asked)."""
    members = tuple(sorted(
        (m.member_id, m.instance_id, m.rack_id, int(m.member_epoch), m.client_id, m.client_host,
         tuple(sorted(m.subscribed_topic_names)), m.subscribed_topic_regex, _partitions(m.assignment),
         _partitions(m.target_assignment), int(m.member_type))
        for m in group.members))
    return (int(group.error_code), group.error_message, group.group_state, int(group.group_epoch),
            int(group.assignment_epoch), group.assignor_name, members)


class Side:
    """One coordinator, reached the way a client reaches it."""

    def __init__(self, name: str, client: KafkaClient) -> None:
        self.name = name
        self.client = client

    async def heartbeat(self, group_id: str, member_id: str, member_epoch: int, *,
                        topics: tuple[str, ...] | None = None, regex: str | None = None,
                        owned: Owned | None = None, instance_id: str | None = None, rack_id: str | None = None,
                        rebalance_timeout_ms: int = -1, server_assignor: str | None = None) -> Answer:
        partition_class = nested(ApiKey.CONSUMER_GROUP_HEARTBEAT, HEARTBEAT_VERSION, "topic_partitions")
        body = request(ApiKey.CONSUMER_GROUP_HEARTBEAT, HEARTBEAT_VERSION, group_id=group_id, member_id=member_id,
                       member_epoch=member_epoch, instance_id=instance_id, rack_id=rack_id,
                       rebalance_timeout=ms(rebalance_timeout_ms), subscribed_topic_names=topics,
                       subscribed_topic_regex=regex, server_assignor=server_assignor,
                       topic_partitions=None if owned is None else tuple(
                           partition_class(topic_id=t, partitions=tuple(ps)) for t, ps in owned.items()))
        return answer_of(await self.client.request(body))

    async def describe(self, group_id: str) -> tuple[Any, ...]:
        body = request(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, group_ids=(group_id,), include_authorized_operations=False)
        return snapshot_of((await self.client.request(body)).groups[0])


def plain(value: Any) -> Any:
    """A kio response as nested tuples of (field, value), throttle time left out (it is not the group's)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return tuple((f.name, plain(getattr(value, f.name))) for f in dataclasses.fields(value)
                     if f.name != "throttle_time")
    if isinstance(value, tuple):
        return tuple(plain(item) for item in value)
    return value


def group_records(bootstrap: str, topic: str, group_id: str) -> list[ConsumerGroupRecord]:
    """A consumer group's records in a topic of `__consumer_offsets` format, in log order, with what is ours to
    choose set aside: a regex resolution's metadata version and time."""
    records = []
    for key, value, _partition, _offset in read_raw(bootstrap, topic):
        record = decode(key, value) if key is not None and record_type_of(key) in CONSUMER_GROUP_TYPES else None
        if record is None or record.group_id != group_id:
            continue
        if isinstance(record, RegexRecord):
            record = dataclasses.replace(record, version=0, timestamp_ms=0)
        records.append(record)
    return records


class Pair:
    """Kafka's coordinator and ours, driven in lock step."""

    def __init__(self, kafka: Side, ours: Side, *, bootstrap: str = "", state_topic: str = "",
                 ours_bootstrap: str = "") -> None:
        self.sides = (kafka, ours)
        self.bootstrap = bootstrap  # the cluster both keep their records in
        self.ours_bootstrap = ours_bootstrap  # our listener, where a client reaches the cluster through the relay
        self.state_topics = ("__consumer_offsets", state_topic)  # Kafka's and ours

    async def same_records(self, group_id: str) -> list[ConsumerGroupRecord]:
        """The group's records (types 3-8 and 16) in Kafka's __consumer_offsets and in our state topic must be
        the same, in the same order; returns them."""
        kafka, ours = [await asyncio.to_thread(group_records, self.bootstrap, topic, group_id)
                       for topic in self.state_topics]
        assert ours == kafka, f"records of {group_id}:\nKafka {kafka}\nours  {ours}"
        return kafka

    async def same(self, api_key: int, version: int, *, normalize: Callable[[Any], Any] = lambda r: r,
                   **fields: Any) -> Any:
        """Any request, the same to both; the answers (after `normalize`) must be equal field by field. Returns
        Kafka's answer."""
        body = request(api_key, version, **fields)
        kafka, ours = [normalize(await side.client.request(body)) for side in self.sides]
        assert plain(ours) == plain(kafka), f"{api_key} v{version} {fields}: Kafka {kafka} ours {ours}"
        return kafka

    async def heartbeat(self, group_id: str, member_id: str, member_epoch: int, **fields: Any) -> Answer:
        """The same heartbeat to both; they must answer the same. Returns Kafka's answer."""
        kafka, ours = [await side.heartbeat(group_id, member_id, member_epoch, **fields) for side in self.sides]
        assert ours == kafka, f"heartbeat {member_id}@{member_epoch} {fields}: Kafka {kafka} ours {ours}"
        return kafka

    async def describe(self, group_id: str) -> tuple[Any, ...]:
        kafka, ours = [await side.describe(group_id) for side in self.sides]
        assert ours == kafka, f"describe {group_id}: Kafka {kafka} ours {ours}"
        return kafka

    async def ready(self, group_id: str, timeout_s: float) -> None:
        """Both coordinators serve `group_id` (loaded: not COORDINATOR_LOAD_IN_PROGRESS / NOT_AVAILABLE)."""
        for side in self.sides:
            await wait_until(functools.partial(_served, side, group_id), timeout_s,
                             f"{side.name} serving {group_id}", interval_s=0.3)

    async def converge(self, group_id: str, condition: Callable[[tuple[Any, ...]], bool], timeout_s: float,
                       what: str, keep_alive: tuple[str, ...] = ()) -> tuple[Any, ...]:
        """Polls both sides' describe until `condition(snapshot)` holds on each (asynchronous work: regex
        resolution, timers), heartbeating the `keep_alive` members on both sides meanwhile (each at its epoch,
        owning what it is assigned); returns the snapshot, which must then be the same."""
        async def settled() -> bool:
            done = []
            for side in self.sides:
                snapshot = await side.describe(group_id)
                members = {m[0]: m for m in snapshot[6]}
                for member_id in keep_alive:
                    if member_id in members:
                        epoch, assigned = members[member_id][3], members[member_id][8]
                        await side.heartbeat(group_id, member_id, epoch,
                                             owned={t: tuple(sorted(ps)) for t, ps in assigned})
                done.append(bool(condition(snapshot)))
            return all(done)

        await wait_until(settled, timeout_s, what, interval_s=0.3)
        return await self.describe(group_id)


async def _served(side: Side, group_id: str) -> bool:
    return (await side.describe(group_id))[0] not in _NOT_SERVING


async def connect(host: str, port: int, group_probe: str, timeout_s: float = 60) -> KafkaClient:
    """A client to the coordinator of `group_probe` at host:port (a one-broker cluster, or our coordinator),
    once FindCoordinator says it is ready."""
    client = await KafkaClient.connect(host, port, client_id="differential")

    async def ready() -> bool:
        found = await client.request(request(ApiKey.FIND_COORDINATOR, 4, key_type=0,
                                             coordinator_keys=(group_probe,)))
        return int(found.coordinators[0].error_code) == 0

    await wait_until(ready, timeout_s, f"a coordinator for {group_probe} at {host}:{port}", interval_s=0.5)
    return client


async def close(*clients: KafkaClient) -> None:
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
