"""Stock consumers bootstrapped to `coordinator serve` (relay on): librdkafka (confluent-kafka), aiokafka and Java
(kafka-clients) consumers in one group share a real topic, every record consumed once, offsets committed to us, while the
cluster's own group coordinator never hears of the group. Records are produced through the relay too (acks=all,
idempotent), by both clients."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from tests.support.relay import (RECORDS_PER_PARTITION, check_exactly_once, committed_offsets, create_topic,
                                 described_group, listed_groups, produce, settled_assignment, split_address,
                                 start_consumers, stop_all)
from tests.support.polling import wait_until
from tests.support.service import FAST, service, unique

TIMEOUT_S = 90
HALF = RECORDS_PER_PARTITION // 2


async def produce_with_aiokafka(bootstrap: str, topic: str, first: int, count: int) -> dict[int, list[str]]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        values = {p: [f"p{p}-{n}" for n in range(first, first + count)] for p in range(6)}
        sent = [await producer.send(topic, text.encode(), key=text.encode(), partition=p)
                for p, texts in values.items() for text in texts]
        await asyncio.gather(*sent)
        return values
    finally:
        await producer.stop()


@pytest.mark.parametrize("assignor", ["range", "roundrobin"])
async def test_confluent_aiokafka_and_java_consumers_share_a_topic_through_the_relay(kafka_bootstrap: str,
                                                                                    assignor: str) -> None:
    topic, group = unique(f"relay-{assignor}"), unique(f"relay-{assignor}-group")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic)
    async with service(kafka_bootstrap, unique("__state"), *FAST, relay=True) as running:
        bootstrap = f"127.0.0.1:{running.port}"
        specs = [("confluent", "rdk-1"), ("confluent", "rdk-2"), ("confluent", "rdk-3"),
                 ("aiokafka", "aio-1"), ("aiokafka", "aio-2"), ("java", "java-1")]
        consumers = await start_consumers(specs, bootstrap, topic, group, assignor)
        try:
            await wait_until(lambda: settled_assignment(consumers), TIMEOUT_S, "six consumers sharing six partitions")
            # produced through the relay once the group is settled: no rebalance can hand a record out twice
            produced = await asyncio.to_thread(produce, bootstrap, topic, 0, HALF)
            more = await produce_with_aiokafka(bootstrap, topic, HALF, HALF)
            produced = {p: produced[p] + more[p] for p in produced}
            total = sum(len(values) for values in produced.values())
            await wait_until(lambda: sum(len(c.records) for c in consumers) >= total, TIMEOUT_S, "every record")
            check_exactly_once(consumers, produced)

            # a consumer counts a record before its commit is answered: the last commits may still be on their way
            expected = {p: RECORDS_PER_PARTITION for p in range(6)}

            async def all_committed() -> bool:
                return await committed_offsets(running.port, group, topic) == expected

            await wait_until(all_committed, TIMEOUT_S, f"committed offsets {expected}", interval_s=0.2)

            ours = await described_group("127.0.0.1", running.port, group)
            assert (ours.group_state, ours.protocol_data, len(ours.members)) == ("Stable", assignor, 6), ours
            assert {m.client_id for m in ours.members} == {name for _kind, name in specs}
            upstream_host, upstream_port = split_address(kafka_bootstrap.split(",")[0])
            assert group not in await listed_groups(upstream_host, upstream_port)
            theirs = await described_group(upstream_host, upstream_port, group)
            assert not theirs.members and theirs.group_state in ("Dead", ""), theirs
            assert group in await listed_groups("127.0.0.1", running.port)
        finally:
            await stop_all(consumers)
        for consumer in consumers:
            assert consumer.closed, (consumer.name, consumer.stderr[-2000:])
