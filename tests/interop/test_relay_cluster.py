"""The relay in front of a real 3-broker KRaft cluster: Metadata through it names a listener of ours for every
broker (port = base + node id) plus the coordinator's node; a topic whose partitions are led by every broker is
consumed through the per-broker listeners by librdkafka, aiokafka and Java consumers in one group; one broker is
stopped, its partitions' leadership moves, and the consumers follow through the relay without losing a record."""

from __future__ import annotations

import asyncio
import time

from coordinator.relay import DEFAULT_NODE_ID
from tests.support.relay import (brokers_seen, committed_offsets, create_topic, partition_leaders, produce,
                                 relay_ports, settled_assignment, start_consumers, stop_all)
from tests.support.polling import wait_until
from tests.support.service import FAST, service, unique

TIMEOUT_S = 120
BATCH = 30


def consumed(consumers: list) -> set[str]:
    return {value for consumer in consumers for _p, _o, value, _c in consumer.records}


async def test_every_broker_through_the_relay_and_consumers_follow_a_leadership_move(kafka_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = kafka_cluster.bootstrap
    topic, group = unique("relay-cluster"), unique("relay-cluster-group")
    await asyncio.to_thread(create_topic, cluster, topic, 6, 3)
    port, base_port = relay_ports(brokers=3)
    bootstrap = f"127.0.0.1:{port}"
    async with service(cluster, unique("__state"), *FAST, listen=bootstrap, relay=True,
                       args=("--relay-base-port", str(base_port))) as running:
        brokers = await asyncio.to_thread(brokers_seen, bootstrap)
        assert brokers == {**{n: ("127.0.0.1", base_port + n) for n in (1, 2, 3)},
                           DEFAULT_NODE_ID: ("127.0.0.1", port)}, brokers
        leaders = await asyncio.to_thread(partition_leaders, bootstrap, topic)
        assert set(leaders.values()) == {1, 2, 3}, leaders

        specs = [("confluent", "rdk-1"), ("confluent", "rdk-2"), ("aiokafka", "aio-1"), ("java", "java-1")]
        consumers = await start_consumers(specs, bootstrap, topic, group, "range", session_ms=10_000)
        try:
            await wait_until(lambda: settled_assignment(consumers), TIMEOUT_S, "four consumers sharing the topic")
            expected = {v for values in (await asyncio.to_thread(produce, bootstrap, topic, 0, BATCH)).values()
                        for v in values}
            await wait_until(lambda: consumed(consumers) >= expected, TIMEOUT_S, "records from every broker")

            victim = leaders[0]
            await asyncio.to_thread(kafka_cluster.stop_broker, victim)
            survivor_address = next(kafka_cluster.address(n) for n in (1, 2, 3) if n != victim)
            await wait_until(lambda: victim not in partition_leaders(survivor_address, topic).values(), TIMEOUT_S,
                             f"leadership moving off broker {victim}", interval_s=0.5)
            second = await asyncio.to_thread(produce, bootstrap, topic, BATCH, BATCH)
            expected |= {v for values in second.values() for v in values}
            await wait_until(lambda: consumed(consumers) >= expected, TIMEOUT_S,
                             "every record after the leadership move")
            # a consumer reports its records before its commit of them is answered (the Java one emits RECORD,
            # then commitSync): wait for the commits, bounded
            wanted = {p: 2 * BATCH for p in range(6)}
            deadline = time.monotonic() + TIMEOUT_S
            while (committed := await committed_offsets(running.port, group, topic)) != wanted:
                assert time.monotonic() < deadline, committed
                await asyncio.sleep(0.2)
            await wait_until(lambda: victim not in brokers_seen(bootstrap), TIMEOUT_S, "the stopped broker unlisted")
            assert f"event=relay_listener_closed node_id={victim}" in running.log_text()
        finally:
            await stop_all(consumers)
