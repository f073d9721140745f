"""Stock consumers find their group on another coordinator instance: two instances in-process, each with the relay
to the real broker, one directory between them (what the owner map would say: the group's partition is the second
instance's). librdkafka (follows FindCoordinator) and aiokafka (connects to the coordinator only if Metadata lists
its node) are both bootstrapped to the FIRST instance, and must end up in the group on the second, consuming
every record through the first instance's relay listeners."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from coordinator.group.partitioner import partition_for
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.relay import Relay, RelayConfig
from coordinator.server import CoordinatorServer, ServerConfig
from coordinator.server.handlers import served_ranges
from coordinator.timer import SystemTimer
from tests.support.inprocess_instances import PARTITIONS, StaticDirectory
from tests.support.relay import (RECORDS_PER_PARTITION, create_topic, produce, relay_ports, settled_assignment,
                                 start_consumers, stop_all)
from tests.support.polling import wait_until
from tests.support.server import FAST_GROUPS
from tests.support.service import unique

TIMEOUT_S = 120


@dataclass
class Instance:
    server: CoordinatorServer
    runtime: GroupRuntime
    timer: SystemTimer

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"


@asynccontextmanager
async def instances(bootstrap: str, count: int, directory: StaticDirectory) -> AsyncIterator[list[Instance]]:
    started: list[Instance] = []
    try:
        for index in range(count):
            port, base_port = relay_ports()
            timer = SystemTimer(f"instance-{index}")
            timer.start()
            runtime = GroupRuntime(FAST_GROUPS, timer, InMemoryGroupStore())
            config = ServerConfig(listen_host="127.0.0.1", listen_port=port, node_id=2_000_000_100 + index)
            relay = Relay(RelayConfig(base_port=base_port), bootstrap, served=served_ranges(),
                          max_frame_bytes=config.max_frame_bytes)
            server = CoordinatorServer(config, runtime, on_shutdown=runtime.shutdown, relay=relay,
                                       directory=directory)
            started.append(Instance(server, runtime, timer))
            await server.start()
            directory.live.append(server.node)
        yield started
    finally:
        for instance in started:
            await instance.server.close()
            await instance.timer.close()


async def test_stock_consumers_bootstrapped_to_one_instance_join_their_group_on_another(kafka_bootstrap: str
                                                                                        ) -> None:
    topic, group = unique("discovery"), unique("discovery-group")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic)
    produced = await asyncio.to_thread(produce, kafka_bootstrap, topic, 0, RECORDS_PER_PARTITION)
    directory = StaticDirectory(PARTITIONS)
    async with instances(kafka_bootstrap, 2, directory) as (first, second):
        owned = partition_for(group, PARTITIONS)
        await first.runtime.unload([owned])  # the group's partition is the second instance's...
        await second.runtime.unload([p for p in range(PARTITIONS) if p != owned])
        directory.owners = {p: (second if p == owned else first).server.node for p in range(PARTITIONS)}

        consumers = await start_consumers([("confluent", "rdk-1"), ("aiokafka", "aio-1")], first.address, topic,
                                          group, "range")  # ...and the consumers know only the first
        try:
            await wait_until(lambda: settled_assignment(consumers), TIMEOUT_S, "both consumers sharing the topic")
            total = sum(len(values) for values in produced.values())
            await wait_until(lambda: sum(len(c.records) for c in consumers) >= total, TIMEOUT_S, "every record")
            consumed = sorted(value for c in consumers for _p, _o, value, _c in c.records)
            assert consumed == sorted(v for values in produced.values() for v in values)

            described = second.runtime.describe_group(group)
            assert (described.group_state, len(described.members)) == ("Stable", 2), described
            assert group not in first.runtime.groups
        finally:
            await stop_all(consumers)
        for consumer in consumers:
            assert consumer.closed, (consumer.name, consumer.stderr[-2000:])
