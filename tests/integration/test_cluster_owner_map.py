"""The owner map against a real broker: two real consumers form the instances group on a real state topic (as
the membership consumers do), and the map follows what Kafka assigns them, including one of them leaving."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer

from coordinator.cluster.directory import OwnerMapDirectory
from coordinator.cluster.identity import InstanceEndpoint, client_id_for
from coordinator.cluster.owner_map import OwnerMap
from coordinator.config import CoordinatorConfig
from coordinator.group.partitioner import partition_for
from coordinator.loadgen.simulation import ensure_topic
from protocol.apis import ApiKey
from tests.support.server import RunningServer
from tests.support.wire import request

PARTITIONS = 6
A = InstanceEndpoint("a", 2_000_000_201, "127.0.0.1", 9201)
B = InstanceEndpoint("b", 2_000_000_202, "127.0.0.1", 9202)
WAIT_S = 90  # a loaded 2-core machine: joins and rebalances take seconds


class InstanceConsumer:
    """A member of the instances group like the membership consumer (cooperative-sticky, never consumes), on a
    thread of its own that also closes it."""

    def __init__(self, bootstrap: str, group_id: str, topic: str, endpoint: InstanceEndpoint,
                 on_change: Callable[[set[int]], None] = lambda owned: None) -> None:
        self.owned: set[int] = set()
        self._on_change = on_change
        self._stop = threading.Event()
        self._settings = {"bootstrap.servers": bootstrap, "group.id": group_id, "client.id": client_id_for(endpoint),
                          "partition.assignment.strategy": "cooperative-sticky", "enable.auto.commit": False,
                          "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
        self._topic = topic
        self._thread = threading.Thread(target=self._run, name=f"instance-{endpoint.instance_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        consumer = Consumer(self._settings)
        consumer.subscribe([self._topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._revoked)
        try:
            while not self._stop.is_set():
                consumer.poll(0.2)
        finally:
            consumer.close()  # leaves the group: its partitions move at once

    def _assigned(self, consumer: Consumer, partitions: list) -> None:
        self.owned |= {tp.partition for tp in partitions}
        self._on_change(set(self.owned))

    def _revoked(self, consumer: Consumer, partitions: list) -> None:
        self.owned -= {tp.partition for tp in partitions}
        self._on_change(set(self.owned))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_the_map_follows_the_instances_group_on_a_real_broker(kafka_bootstrap: str) -> None:
    topic = f"state-{uuid.uuid4().hex[:8]}"
    group_id = f"{topic}.coordinators"
    await asyncio.to_thread(ensure_topic, kafka_bootstrap, topic, PARTITIONS)
    owner_map = OwnerMap(kafka_bootstrap, group_id, topic, PARTITIONS, A, refresh_ms=300)
    await owner_map.start()
    consumers: list[InstanceConsumer] = []
    try:
        consumers.append(InstanceConsumer(kafka_bootstrap, group_id, topic, A, owner_map.set_own))
        b = InstanceConsumer(kafka_bootstrap, group_id, topic, B, lambda owned: owner_map.refresh_soon())
        consumers.append(b)
        a = consumers[0]

        def split_as_kafka_assigned() -> bool:
            return (bool(a.owned) and bool(b.owned) and a.owned | b.owned == set(range(PARTITIONS))
                    and owner_map.instances() == [A, B]
                    and all(owner_map.owner(p) == (A if p in a.owned else B) for p in range(PARTITIONS)))

        await _until(split_as_kafka_assigned, "both instances and their partitions in the map")
        assert owner_map.own == frozenset(a.owned)

        await asyncio.to_thread(b.stop)  # a clean stop leaves the group
        await _until(lambda: owner_map.instances() == [A]
                     and all(owner_map.owner(p) == A for p in range(PARTITIONS)),
                     "B gone and every partition A's")
    finally:
        for consumer in consumers:
            await asyncio.to_thread(consumer.stop)
        await owner_map.close()


async def test_find_coordinator_on_either_instance_names_the_owner_kafka_assigned(kafka_bootstrap: str) -> None:
    """The chain end to end, minus the group runtime's loading: two servers whose directories are owner maps of
    a real instances group; FindCoordinator on the first answers, for every group, the instance that Kafka
    assigned the group's partition to, and Metadata lists both instances."""
    topic = f"state-{uuid.uuid4().hex[:8]}"
    group_id = f"{topic}.coordinators"
    await asyncio.to_thread(ensure_topic, kafka_bootstrap, topic, PARTITIONS)
    config = CoordinatorConfig(offsets_topic_num_partitions=PARTITIONS)
    envs: list[RunningServer] = []
    maps: list[OwnerMap] = []
    consumers: list[InstanceConsumer] = []
    try:
        for index in range(2):
            directory = OwnerMapDirectory(PARTITIONS, "cluster")
            env = RunningServer(config, node_id=2_000_000_300 + index, directory=directory)
            await env.__aenter__()
            envs.append(env)
            endpoint = InstanceEndpoint(f"i{index}", env.server.node.node_id, "127.0.0.1", env.port)
            owner_map = OwnerMap(kafka_bootstrap, group_id, topic, PARTITIONS, endpoint, refresh_ms=300)
            directory.attach(owner_map)
            await owner_map.start()
            maps.append(owner_map)
            consumers.append(InstanceConsumer(kafka_bootstrap, group_id, topic, endpoint, owner_map.set_own))
        # both consumers owning partitions: the cooperative rounds are over (before, one may hold all of them)
        await _until(lambda: all(len(m.instances()) == 2 for m in maps) and all(c.owned for c in consumers)
                     and _agreed(maps, consumers), "both maps knowing both instances and every owner")

        client = await envs[0].client()
        groups = [f"g-{n}" for n in range(20)]
        found = await client.request(request(ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=tuple(groups)))
        expected = [envs[0].port if partition_for(g, PARTITIONS) in consumers[0].owned else envs[1].port
                    for g in groups]
        assert [(c.key, int(c.error_code), c.port) for c in found.coordinators] == [
            (g, 0, port) for g, port in zip(groups, expected)]
        assert len(set(expected)) == 2  # both instances are asked for
        metadata = await client.request(request(ApiKey.METADATA, 12, topics=(), allow_auto_topic_creation=False,
                                                include_cluster_authorized_operations=False,
                                                include_topic_authorized_operations=False))
        assert sorted(b.port for b in metadata.brokers) == sorted(env.port for env in envs)
    finally:
        for consumer in consumers:
            await asyncio.to_thread(consumer.stop)
        for owner_map in maps:
            await owner_map.close()
        for env in envs:
            await env.__aexit__(None, None, None)


def _agreed(maps: list[OwnerMap], consumers: list[InstanceConsumer]) -> bool:
    owners = {p: consumer_index for consumer_index, c in enumerate(consumers) for p in c.owned}
    if sorted(owners) != list(range(PARTITIONS)):
        return False
    return all(m.owner(p) == maps[owners[p]].me for m in maps for p in range(PARTITIONS))
