"""Kafka's consumer group protocol (KIP-848) with real clients: confluent-kafka consumers with
`group.protocol=consumer`, alone or with Kafka 4.1's Java consumer on the same protocol, bootstrapped to
`coordinator serve` (relay on), share a real topic through ConsumerGroupHeartbeat served here: every record
consumed once, offsets committed to us equal the end offsets, the group described by ConsumerGroupDescribe and by
kafka-consumer-groups; one consumer leaves (or is killed) and the other gets every partition; a regex
subscription picks up a new topic."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.kafka_tools import consumer_groups, table
from tests.support.relay import consumer_group_described as describe
from tests.support.service import service, unique
from tests.support.relay import (
    RECORDS_PER_PARTITION,
    committed_reaching,
    create_topic,
    produce,
    relay_ports,
    settled_assignment,
    start_consumers,
    stop_all,
)
from tests.support.polling import wait_until
from tests.support.relay import check_exactly_once

pytestmark = pytest.mark.interop

TIMEOUT_S = 90
FAST = ("group.consumer.min.heartbeat.interval.ms=500", "group.consumer.heartbeat.interval.ms=500",
        "group.consumer.min.session.timeout.ms=10000", "group.consumer.session.timeout.ms=10000")


@pytest.mark.parametrize("second", ["confluent", "java"])
async def test_two_consumer_protocol_clients_share_a_topic_then_one_leaves(kafka_bootstrap: str,
                                                                           second: str) -> None:
    topic, group = unique("kip848"), unique("kip848-group")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic)
    async with service(kafka_bootstrap, unique("__state"), *FAST, relay=True) as running:
        bootstrap = f"127.0.0.1:{running.port}"
        consumers = await start_consumers([("confluent", "rdk-1"), (second, "rdk-2")], bootstrap, topic, group,
                                          "uniform", protocol="consumer")
        try:
            await wait_until(lambda: settled_assignment(consumers), TIMEOUT_S, "two consumers sharing six partitions")
            assert sorted(len(c.assigned) for c in consumers) == [3, 3]
            described = await describe(running.port, group)
            assert (int(described.error_code), described.group_state, described.assignor_name) == (0, "Stable",
                                                                                                     "uniform")
            assert described.group_epoch == described.assignment_epoch == 2
            assert sorted(m.client_id for m in described.members) == ["rdk-1", "rdk-2"]
            assert {int(m.member_type) for m in described.members} == {1}
            if second == "confluent":  # Kafka's own tool describes the group through ConsumerGroupDescribe
                state = table(await asyncio.to_thread(consumer_groups, running.port, "--describe", "--group", group,
                                                      "--state", "--verbose"))
                row = dict(zip([h for h in state[0] if h != "(ID)"], [v for v in state[1] if not v.startswith("(")]))
                assert {k: row.get(k) for k in ("ASSIGNMENT-STRATEGY", "STATE", "GROUP-EPOCH",
                                                "TARGET-ASSIGNMENT-EPOCH", "#MEMBERS")} == {
                    "ASSIGNMENT-STRATEGY": "uniform", "STATE": "Stable", "GROUP-EPOCH": "2",
                    "TARGET-ASSIGNMENT-EPOCH": "2", "#MEMBERS": "2"}, state
                listed = table(await asyncio.to_thread(consumer_groups, running.port, "--list", "--type"))
                assert [group, "Consumer"] in listed, listed

            produced = await asyncio.to_thread(produce, bootstrap, topic, 0, RECORDS_PER_PARTITION)
            total = sum(len(values) for values in produced.values())
            await wait_until(lambda: sum(len(c.records) for c in consumers) >= total, TIMEOUT_S, "every record")
            check_exactly_once(consumers, produced)
            await committed_reaching(running.port, group, topic, {p: RECORDS_PER_PARTITION for p in range(6)},
                                     TIMEOUT_S)

            leaving, staying = consumers
            await leaving.terminate()
            assert leaving.closed, leaving.stderr[-2000:]
            await wait_until(lambda: sorted(staying.assigned) == list(range(6)), TIMEOUT_S,
                             "the remaining consumer owning every partition")
            described = await describe(running.port, group)
            assert [m.client_id for m in described.members] == ["rdk-2"]
            assert described.group_state == "Stable" and described.group_epoch == 3
        finally:
            await stop_all(consumers)
        for consumer in consumers:
            assert consumer.closed, (consumer.name, consumer.stderr[-2000:])


async def test_a_killed_consumer_is_fenced_at_its_session_timeout(kafka_bootstrap: str) -> None:
    topic, group = unique("kip848-kill"), unique("kip848-kill-group")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic)
    async with service(kafka_bootstrap, unique("__state"), *FAST, relay=True) as running:
        bootstrap = f"127.0.0.1:{running.port}"
        consumers = await start_consumers([("confluent", "rdk-1"), ("confluent", "rdk-2")], bootstrap, topic, group,
                                          "range", protocol="consumer")
        try:
            await wait_until(lambda: settled_assignment(consumers), TIMEOUT_S, "two consumers sharing six partitions")
            assert (await describe(running.port, group)).assignor_name == "range"
            victim, survivor = consumers
            victim_id = next(m.member_id for m in (await describe(running.port, group)).members
                             if m.client_id == victim.name)
            await victim.kill()  # no leave: only the session timeout (10 s here) can tell
            await wait_until(lambda: sorted(survivor.assigned) == list(range(6)), TIMEOUT_S,
                             "the survivor owning every partition")
            line = f"Member {victim_id} fenced from the group because the member session expired."
            assert line in running.log_path.read_text(errors="replace")
            produced = await asyncio.to_thread(produce, bootstrap, topic, 0, RECORDS_PER_PARTITION)
            total = sum(len(values) for values in produced.values())
            await wait_until(lambda: len(survivor.records) >= total, TIMEOUT_S, "every record by the survivor")
            check_exactly_once([survivor], produced)
        finally:
            await stop_all(consumers)


async def test_consumer_protocol_clients_carry_on_through_a_coordinator_sigkill(kafka_bootstrap: str) -> None:
    topic, group, state_topic = unique("kip848-restart"), unique("kip848-restart-group"), unique("__state")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic)
    port, base_port = relay_ports()
    options = dict(listen=f"127.0.0.1:{port}", relay=True, args=("--relay-base-port", str(base_port)))
    bootstrap = f"127.0.0.1:{port}"
    consumers: list = []
    try:
        async with service(kafka_bootstrap, state_topic, *FAST, **options) as first:  # type: ignore[arg-type]
            consumers = await start_consumers([("confluent", "rdk-1"), ("confluent", "rdk-2")], bootstrap, topic,
                                              group, "uniform", protocol="consumer")
            await wait_until(lambda: settled_assignment(consumers), TIMEOUT_S, "two consumers settled")
            before = await describe(first.port, group)
            produced = await asyncio.to_thread(produce, bootstrap, topic, 0, RECORDS_PER_PARTITION // 2)
            await wait_until(lambda: sum(len(c.records) for c in consumers) >= 3 * RECORDS_PER_PARTITION,
                             TIMEOUT_S, "the first half")
            first.process.kill()  # no shutdown: the group's records in the state topic are all there is
            await first.process.wait()
        async with service(kafka_bootstrap, state_topic, *FAST, **options) as second:  # type: ignore[arg-type]
            loaded = await wait_until_loaded(second.port, group)
            assert loaded.group_epoch >= before.group_epoch
            assert {m.member_id for m in loaded.members} == {m.member_id for m in before.members}
            more = await asyncio.to_thread(produce, bootstrap, topic, RECORDS_PER_PARTITION // 2,
                                           RECORDS_PER_PARTITION // 2)
            produced = {p: produced[p] + more[p] for p in produced}
            await wait_until(lambda: sum(len(c.records) for c in consumers) >= 6 * RECORDS_PER_PARTITION,
                             TIMEOUT_S, "every record")
            check_exactly_once(consumers, produced)
            await committed_reaching(second.port, group, topic, {p: RECORDS_PER_PARTITION for p in range(6)},
                                     TIMEOUT_S)
    finally:
        await stop_all(consumers)


async def wait_until_loaded(port: int, group: str, timeout_s: float = 120):  # type: ignore[no-untyped-def]
    """The group as the restarted coordinator describes it, once its state partition is loaded."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        described = await describe(port, group)
        if int(described.error_code) == 0:
            return described
        assert asyncio.get_running_loop().time() < deadline, described
        await asyncio.sleep(0.2)


async def test_a_regex_subscription_picks_up_a_new_topic(kafka_bootstrap: str) -> None:
    prefix = unique("kip848rx")
    first_topic, second_topic, group = f"{prefix}-a", f"{prefix}-b", unique("kip848-regex-group")
    await asyncio.to_thread(create_topic, kafka_bootstrap, first_topic)
    async with service(kafka_bootstrap, unique("__state"), *FAST, relay=True) as running:
        bootstrap = f"127.0.0.1:{running.port}"
        consumers = await start_consumers([("confluent", "rdk-rx")], bootstrap, f"^{prefix}-.*", group, "uniform",
                                          protocol="consumer")
        try:
            async def assigned_topics() -> set[str]:
                described = await describe(running.port, group)
                return {tp.topic_name for m in described.members for tp in m.assignment.topic_partitions}

            deadline = asyncio.get_running_loop().time() + TIMEOUT_S
            while await assigned_topics() != {first_topic}:
                assert asyncio.get_running_loop().time() < deadline, await describe(running.port, group)
                await asyncio.sleep(0.5)
            await asyncio.to_thread(create_topic, kafka_bootstrap, second_topic)
            while await assigned_topics() != {first_topic, second_topic}:  # within a regex refresh (10 s)
                assert asyncio.get_running_loop().time() < deadline, await describe(running.port, group)
                await asyncio.sleep(0.5)
            described = await describe(running.port, group)
            [regex] = [m.subscribed_topic_regex for m in described.members]
            assert f"^{prefix}-.*" in regex  # as librdkafka sends it: "(^...)"
            produced = await asyncio.to_thread(produce, bootstrap, first_topic, 0, 10)
            more = await asyncio.to_thread(produce, bootstrap, second_topic, 1_000, 10)
            expected = {v for values in (*produced.values(), *more.values()) for v in values}
            await wait_until(lambda: {v for _p, _o, v, _c in consumers[0].records} >= expected, TIMEOUT_S,
                             "the records of both topics")
        finally:
            await stop_all(consumers)


async def test_a_static_java_member_restarts_and_gets_its_partitions_back(kafka_bootstrap: str) -> None:
    from tests.support.java_consumer import JavaConsumer

    topic, group = unique("kip848-static"), unique("kip848-static-group")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic)
    async with service(kafka_bootstrap, unique("__state"), *FAST, relay=True) as running:
        bootstrap = f"127.0.0.1:{running.port}"

        def static_member() -> JavaConsumer:
            return JavaConsumer(bootstrap, group, topic, assignor="uniform", client_id="java-static",
                                group_instance_id="instance-1", group_protocol="consumer")

        dynamic = await start_consumers([("confluent", "rdk-1")], bootstrap, topic, group, "uniform",
                                        protocol="consumer")
        java = await asyncio.to_thread(static_member)
        try:
            await wait_until(lambda: len(java.assignment) == 3 and len(dynamic[0].assigned) == 3, TIMEOUT_S,
                             "the static and the dynamic member with three partitions each")
            before = await describe(running.port, group)
            owned = set(java.assignment)
            await asyncio.to_thread(java.close, 30)  # a static member's close leaves with epoch -2
            described = await describe(running.port, group)
            static = [m for m in described.members if m.instance_id == "instance-1"]
            assert [m.member_epoch for m in static] == [-2] and described.group_epoch == before.group_epoch
            java = await asyncio.to_thread(static_member)  # back under the same instance id
            await wait_until(lambda: set(java.assignment) == owned, TIMEOUT_S, "its partitions back")
            after = await describe(running.port, group)
            assert after.group_epoch == before.group_epoch  # no rebalance
            assert sorted(m.instance_id or "" for m in after.members) == ["", "instance-1"]
        finally:
            await asyncio.to_thread(java.close, 30)
            await stop_all(dynamic)
