"""Offsets through the relay now that the coordinator knows the cluster: OffsetCommit refuses partitions the
cluster does not have (UNKNOWN_TOPIC_OR_PARTITION, as Kafka 3.9's KafkaApis does, after a metadata refresh), and
Kafka's own `kafka-consumer-groups` shows lag and resets offsets through the coordinator."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

from coordinator.relay import DEFAULT_NODE_ID
from protocol.apis import ApiKey
from protocol.client import KafkaClient

from tests.support.kafka_tools import consumer_groups, table
from tests.support.relay import create_topic, described_group, listed_groups, produce, split_address
from tests.support.service import FAST, commit, fetch_offsets, service, unique, until_loaded
from tests.support.wire import request

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
        deadline = time.monotonic() + 60  # the refresh, on a loaded machine: bounded
        while await commit(client, group, -1, "", {0: 0}, topic=late) != [0]:
            assert time.monotonic() < deadline, "a commit to a topic created after start-up was never accepted"
            await asyncio.sleep(0.2)
        assert await fetch_offsets(client, group, (0, 1, 2, 3), topic=topic) == {0: 5, 1: 10, 2: 1, 3: -1}

        run = asyncio.to_thread
        described = table(await run(consumer_groups, running.port, "--describe", "--group", group))
        rows = {(row[1], row[2]): row for row in described if len(row) >= 6 and row[1] == topic}
        header = next(row for row in described if row[:2] == ["GROUP", "TOPIC"])
        current, end, lag = (header.index(name) for name in ("CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"))
        assert [(rows[(topic, str(p))][current], rows[(topic, str(p))][end], rows[(topic, str(p))][lag])
                for p in range(3)] == [("5", "10", "5"), ("10", "10", "0"), ("1", "10", "9")], described

        broker_listener = await _check_the_advertised_table_and_rewritten_addresses(client, running.port,
                                                                                    kafka_bootstrap)
        # the group APIs are ours on a broker's listener too: the cluster's coordinator never sees them
        assert group in await listed_groups("127.0.0.1", broker_listener)
        assert (await described_group("127.0.0.1", broker_listener, group)).group_state == "Empty"
        upstream_host, upstream_port = split_address(kafka_bootstrap.split(",")[0])
        assert group not in await listed_groups(upstream_host, upstream_port)

        reset = await run(consumer_groups, running.port, "--reset-offsets", "--group", group, "--topic", topic,
                          "--to-earliest", "--execute")
        assert topic in reset, reset
        assert await fetch_offsets(client, group, (0, 1, 2), topic=topic) == {0: 0, 1: 0, 2: 0}
        await client.close()


async def _check_the_advertised_table_and_rewritten_addresses(client: KafkaClient, port: int, cluster: str) -> int:
    """Checks ApiVersions, Metadata and FindCoordinator through the relay; returns broker 1's listener port."""
    versions = client.api_versions  # what ApiVersions through the relay advertised
    assert versions[ApiKey.JOIN_GROUP] == (0, 9) and versions[ApiKey.OFFSET_COMMIT] == (2, 9)  # ours
    assert versions[0][1] >= 12 and versions[1][1] <= 15  # Produce: endpoints rewritten; Fetch below KIP-951
    assert versions[68] == (0, 1) and versions[69] == (0, 1)  # the consumer group protocol: ours
    assert versions[ApiKey.TXN_OFFSET_COMMIT] == (0, 5)  # ours, Kafka 4.1.1's range
    # group APIs we do not serve (the share and streams groups) are not advertised
    assert not {60, 76, 77, 78, 79} & set(versions), sorted(versions)

    metadata = await client.request(request(ApiKey.METADATA, 12, topics=None, allow_auto_topic_creation=False,
                                            include_topic_authorized_operations=False))
    brokers = {b.node_id: (b.host, b.port) for b in metadata.brokers}
    upstream_port = int(cluster.split(",")[0].rsplit(":", 1)[1])
    assert brokers[DEFAULT_NODE_ID] == ("127.0.0.1", port)
    assert brokers[1][0] == "127.0.0.1" and brokers[1][1] not in (port, upstream_port), brokers

    ours = await client.request(request(ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=("g-1", "g-2")))
    assert [(c.key, c.node_id, c.port) for c in ours.coordinators] == [("g-1", DEFAULT_NODE_ID, port),
                                                                        ("g-2", DEFAULT_NODE_ID, port)]
    # the broker creates its transaction state topic on the first lookup (seconds for a loaded JVM): bounded wait
    deadline = time.monotonic() + 120
    while True:
        found = await client.request(request(ApiKey.FIND_COORDINATOR, 4, key_type=1, coordinator_keys=("tx-1",)))
        entry = found.coordinators[0]
        if entry.error_code == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.3)
    assert (entry.error_code, entry.node_id, (entry.host, entry.port)) == (0, 1, brokers[1]), entry

    # an API we do not advertise closes the connection, as Kafka does; an unknown ApiVersions version gets KIP-511
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.sendall(struct.pack(">ihhih", 10, 18, 99, 7, -1))
        size, correlation_id, error_code = struct.unpack(">iih", raw.recv(10))
        assert (correlation_id, error_code) == (7, 35)  # UNSUPPORTED_VERSION, our range follows
        raw.recv(size - 6)
        raw.sendall(struct.pack(">ihhih", 10, 28, 3, 8, -1))  # TxnOffsetCommit
        assert raw.recv(1) == b""
    return brokers[1][1]
