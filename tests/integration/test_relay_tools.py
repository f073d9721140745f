"""Offsets through the relay now that the coordinator knows the cluster: OffsetCommit refuses partitions the
cluster does not have (UNKNOWN_TOPIC_OR_PARTITION, as Kafka 3.9's KafkaApis does, after a metadata refresh), and
Kafka's own `kafka-consumer-groups` shows lag and resets offsets through the coordinator."""

from __future__ import annotations

import asyncio

from tests.integration.test_e2e_kafka_cli import consumer_groups, table
from tests.integration.test_e2e_support import commit, fetch_offsets, service, unique, until_loaded
from tests.interop.relay_support import FAST, create_topic, produce

UNKNOWN_TOPIC_OR_PARTITION = 3


async def test_offset_commits_are_checked_against_the_cluster_and_kafka_tools_show_lag(kafka_bootstrap: str) -> None:
    topic, group = unique("relay-tools"), unique("relay-tools-group")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic, 3)
    await asyncio.to_thread(produce, kafka_bootstrap, topic, 0, 10, 3)
    async with service(kafka_bootstrap, unique("__state"), *FAST, relay=True) as running:
        client = await running.client()
        await until_loaded(client)
        assert await commit(client, group, -1, "", {0: 4, 1: 10, 2: 1}, topic=topic) == [0, 0, 0]
        # partition 3 does not exist: refused, partition 0 committed
        assert sorted(await commit(client, group, -1, "", {0: 5, 3: 1}, topic=topic)) == [0, UNKNOWN_TOPIC_OR_PARTITION]
        assert await commit(client, group, -1, "", {0: 1}, topic=unique("absent")) == [UNKNOWN_TOPIC_OR_PARTITION]
        late = unique("relay-late")  # created after the coordinator learned the cluster: found by the refresh
        await asyncio.to_thread(create_topic, kafka_bootstrap, late, 1)
        # a client retries UNKNOWN_TOPIC_OR_PARTITION (the brokers learn a new topic a moment after it is created)
        for _attempt in range(50):
            if await commit(client, group, -1, "", {0: 0}, topic=late) == [0]:
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("a commit to a topic created after start-up was never accepted")
        assert await fetch_offsets(client, group, (0, 1, 2, 3), topic=topic) == {0: 5, 1: 10, 2: 1, 3: -1}

        run = asyncio.to_thread
        described = table(await run(consumer_groups, running.port, "--describe", "--group", group))
        rows = {(row[1], row[2]): row for row in described if len(row) >= 6 and row[1] == topic}
        header = next(row for row in described if row[:2] == ["GROUP", "TOPIC"])
        current, end, lag = (header.index(name) for name in ("CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"))
        assert [(rows[(topic, str(p))][current], rows[(topic, str(p))][end], rows[(topic, str(p))][lag])
                for p in range(3)] == [("5", "10", "5"), ("10", "10", "0"), ("1", "10", "9")], described

        reset = await run(consumer_groups, running.port, "--reset-offsets", "--group", group, "--topic", topic,
                          "--to-earliest", "--execute")
        assert topic in reset, reset
        assert await fetch_offsets(client, group, (0, 1, 2), topic=topic) == {0: 0, 1: 0, 2: 0}
        await client.close()
