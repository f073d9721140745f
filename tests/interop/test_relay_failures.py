"""Consumers through the relay when things break: a consumer SIGKILLed (the group notices at its session
timeout, the others carry on from its committed offsets), a consumer closed cleanly (LeaveGroup: the rebalance
starts at once), and the cooperative-sticky assignor's incremental rebalances through the relay (librdkafka and
Java; aiokafka has no cooperative assignor)."""

from __future__ import annotations

import asyncio
import re
import time

from tests.support.relay import committed_offsets, committed_reaching, create_topic, produce, settled_assignment, start_consumers, stop_all
from tests.support.polling import wait_until
from tests.support.service import FAST, service, unique

TIMEOUT_S = 90
SESSION_MS = 6_000
BATCH = 40


def consumed_values(consumers: list) -> set[str]:
    return {value for consumer in consumers for _p, _o, value, _c in consumer.records}


async def test_a_killed_consumer_fails_after_its_session_and_a_closed_one_leaves_at_once(kafka_bootstrap: str) -> None:
    topic, group = unique("relay-failures"), unique("relay-failures-group")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic)
    async with service(kafka_bootstrap, unique("__state"), *FAST, relay=True) as running:
        bootstrap = f"127.0.0.1:{running.port}"
        specs = [("confluent", "victim"), ("confluent", "leaver"), ("aiokafka", "survivor")]
        consumers = await start_consumers(specs, bootstrap, topic, group, "range", session_ms=SESSION_MS)
        victim, leaver, survivor = consumers
        try:
            await wait_until(lambda: settled_assignment(consumers), TIMEOUT_S, "three consumers sharing the topic")
            first = await asyncio.to_thread(produce, bootstrap, topic, 0, BATCH)
            expected = {value for values in first.values() for value in values}
            await wait_until(lambda: consumed_values(consumers) >= expected, TIMEOUT_S, "the first batch")
            await wait_until(lambda: _all_committed(consumers, BATCH), TIMEOUT_S, "the first batch's commits")
            victim_partitions = list(victim.assigned)

            await victim.kill()
            killed_at = time.monotonic()
            second = await asyncio.to_thread(produce, bootstrap, topic, BATCH, BATCH)
            failed = await wait_until(lambda: re.search(r"Member (victim-\S+) in group " + re.escape(group)
                                                        + r" has failed, removing it from the group",
                                                        running.log_text()), TIMEOUT_S, "the has-failed line")
            detected_s = time.monotonic() - killed_at
            assert detected_s >= SESSION_MS / 1000 * 0.8, f"failure declared after {detected_s:.1f}s"
            expected |= {value for values in second.values() for value in values}
            await wait_until(lambda: consumed_values([leaver, survivor]) >= expected - consumed_values([victim]),
                             TIMEOUT_S, "the victim's partitions consumed by the others")
            for partition in victim_partitions:  # taken over exactly where the victim's commits left them
                offsets = [o for c in (leaver, survivor) for p, o, _v, _c in c.records if p == partition]
                assert min(offsets) == BATCH, (partition, sorted(offsets)[:5], failed.group(1))

            await wait_until(lambda: settled_assignment([leaver, survivor]), TIMEOUT_S, "two consumers settled")
            logged_before_leave = len(running.log_text())
            await leaver.terminate()
            await wait_until(lambda: sorted(survivor.assigned) == list(range(6)), TIMEOUT_S,
                             "the survivor owning every partition")
            # the LeaveGroup removed it (not its session running out, however long the rebalance took here)
            since_leave = running.log_text()[logged_before_leave:]
            assert re.search(r"event=member_left group=" + re.escape(group) + r" member=leaver-", since_leave)
            assert not re.search(r"Member leaver-\S+ in group " + re.escape(group) + " has failed", since_leave)
            third = await asyncio.to_thread(produce, bootstrap, topic, 2 * BATCH, BATCH)
            expected |= {value for values in third.values() for value in values}
            await wait_until(lambda: consumed_values(consumers) >= expected, TIMEOUT_S, "every record")
            await committed_reaching(running.port, group, topic, {p: 3 * BATCH for p in range(6)}, TIMEOUT_S)
        finally:
            await stop_all(consumers)


def _all_committed(consumers: list, count: int) -> bool:
    """Each partition's records up to `count` consumed in batches whose commit succeeded."""
    done = {p: 0 for p in range(6)}
    for consumer in consumers:
        for partition, offset, _value, committed in consumer.records:
            if committed:
                done[partition] = max(done[partition], offset + 1)
    return all(offset >= count for offset in done.values())


async def test_cooperative_sticky_consumers_rebalance_incrementally_through_the_relay(kafka_bootstrap: str) -> None:
    topic, group = unique("relay-coop"), unique("relay-coop-group")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic)
    async with service(kafka_bootstrap, unique("__state"), *FAST, relay=True) as running:
        bootstrap = f"127.0.0.1:{running.port}"
        first_two = await start_consumers([("confluent", "coop-1"), ("java", "coop-java")], bootstrap, topic,
                                          group, "cooperative-sticky")
        consumers = list(first_two)
        try:
            await wait_until(lambda: settled_assignment(consumers), TIMEOUT_S, "two consumers settled")
            before = {c.name: set(c.assigned) for c in consumers}
            consumers += await start_consumers([("confluent", "coop-3")], bootstrap, topic, group,
                                               "cooperative-sticky")
            await wait_until(lambda: settled_assignment(consumers) and all(len(c.assigned) == 2 for c in consumers),
                             TIMEOUT_S, "three consumers with two partitions each")
            for consumer in first_two:  # sticky: each kept two of the partitions it had
                assert set(consumer.assigned) <= before[consumer.name], (consumer.name, before, consumer.assigned)
            produced = await asyncio.to_thread(produce, bootstrap, topic, 0, BATCH)
            expected = {value for values in produced.values() for value in values}
            await wait_until(lambda: consumed_values(consumers) >= expected, TIMEOUT_S, "every record")
            values = [value for consumer in consumers for _p, _o, value, _c in consumer.records]
            assert len(values) == len(set(values)) == len(expected)
            await wait_until(lambda: _all_committed(consumers, BATCH), TIMEOUT_S, "the commits")
            assert await committed_offsets(running.port, group, topic) == {p: BATCH for p in range(6)}
            from tests.support.relay import described_group

            described = await described_group("127.0.0.1", running.port, group)
            assert (described.group_state, described.protocol_data) == ("Stable", "cooperative-sticky")
        finally:
            await stop_all(consumers)
