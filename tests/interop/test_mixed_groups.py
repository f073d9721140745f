"""A rolling upgrade of a classic group of real confluent-kafka consumers to `group.protocol=consumer`, one member at
a time, while a producer keeps writing: the first consumer-protocol member converts the classic group online, the
classic members carry on inside the consumer group until they are replaced, and every record is consumed and
committed. The same sequence runs against Kafka 4.1.1's own coordinator (the embedded broker) as the reference:
both must deliver every record and end with the same group (three consumer-protocol members, Stable)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from tests.support.polling import wait_until
from tests.support.relay import (ConsumerProcess, committed_offsets, create_topic, produce, settled_assignment,
                                 stop_all)
from tests.support.relay import consumer_group_described as describe
from tests.support.service import service, unique

pytestmark = pytest.mark.interop

TIMEOUT_S = 90
PARTITIONS = 6
BATCH = 20  # records per partition in each of the producer's batches
FAST = ("group.consumer.min.heartbeat.interval.ms=500", "group.consumer.heartbeat.interval.ms=500",
        "group.consumer.min.session.timeout.ms=10000", "group.consumer.session.timeout.ms=10000")


@contextlib.asynccontextmanager
async def coordinator(target: str, kafka_bootstrap: str) -> AsyncIterator[int]:
    """The port clients bootstrap to: our service relaying to the broker, or the broker itself."""
    if target == "kafka":
        yield int(kafka_bootstrap.rpartition(":")[2])
        return
    async with service(kafka_bootstrap, unique("__state"), *FAST, relay=True) as running:
        yield running.port


class Producer:
    """Batches of BATCH records per partition until stopped; remembers every value it wrote."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.values: set[str] = set()
        self.next = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not self._stop.is_set():
            written = await asyncio.to_thread(produce, self.bootstrap, self.topic, self.next, BATCH, PARTITIONS)
            self.values.update(v for values in written.values() for v in values)
            self.next += BATCH
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.5)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 60)


async def all_committed(port: int, group: str, topic: str, end: int) -> bool:
    return await committed_offsets(port, group, topic, PARTITIONS) == {p: end for p in range(PARTITIONS)}


def consumed(consumers: list[ConsumerProcess]) -> set[str]:
    return {value for c in consumers for _p, _o, value, _c in c.records}


@pytest.mark.parametrize("target", ["ours", "kafka"])
async def test_rolling_upgrade_of_a_classic_group_under_a_producer(kafka_bootstrap: str, target: str) -> None:
    topic, group = unique("mixed"), unique("mixed-group")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic, PARTITIONS)
    async with coordinator(target, kafka_bootstrap) as port:
        bootstrap = f"127.0.0.1:{port}"

        async def consumer(name: str, protocol: str) -> ConsumerProcess:
            # range, not cooperative-sticky: librdkafka's sticky assignments carry user data, which Kafka
            # refuses to drop in an upgrade ("an unsupported custom assignor is in use"), and so do we
            return await ConsumerProcess("confluent", name, bootstrap, topic, group, "range"
                                         if protocol == "classic" else "uniform", 10_000,
                                         protocol=protocol).start()

        live = [await consumer(f"classic-{i}", "classic") for i in range(3)]
        everyone = list(live)
        producer = Producer(bootstrap, topic)
        try:
            await wait_until(lambda: settled_assignment(live), TIMEOUT_S, "three classic consumers settled")
            producer.start()
            for i in range(3):  # one member at a time: a classic consumer leaves, a consumer-protocol one joins
                await live[0].terminate()
                assert live[0].closed, live[0].stderr[-2000:]
                # the first step converts the classic group once its rebalance is over
                await wait_until(lambda: i > 0 or settled_assignment(live[1:]), TIMEOUT_S, "the classic rebalance")
                upgraded = await consumer(f"upgraded-{i}", "consumer")
                everyone.append(upgraded)
                live = live[1:] + [upgraded]
                await wait_until(lambda: settled_assignment(live), TIMEOUT_S, f"settled after upgrade step {i}")
                described = await describe(port, group)
                assert int(described.error_code) == 0, described  # a consumer group from the first step on
                types = sorted(int(m.member_type) for m in described.members)
                assert types == sorted([0] * (2 - i) + [1] * (i + 1)), (i, types)
            await producer.stop()
            expected = producer.values
            await wait_until(lambda: consumed(everyone) >= expected, TIMEOUT_S, "every record consumed")
            await wait_until(lambda: all_committed(port, group, topic, producer.next), TIMEOUT_S,
                             "committed == end offsets")

            async def stable() -> object:  # the last reconciliation may still be under way
                described = await describe(port, group)
                return described if described.group_state == "Stable" else None

            described = await wait_until(stable, TIMEOUT_S, "a Stable group")
            assert sorted(m.client_id for m in described.members) == ["upgraded-0", "upgraded-1", "upgraded-2"]
            assert {int(m.member_type) for m in described.members} == {1}
        finally:
            await producer.stop()
            await stop_all(everyone)
            for c in everyone:  # what a consumer said, for a failure's report
                print(c.name, c.assigned, len(c.records), c.stderr.decode(errors="replace")[-1500:])



@pytest.mark.parametrize("target", ["ours", "kafka"])
async def test_downgrade_when_the_last_consumer_protocol_member_leaves(kafka_bootstrap: str, target: str) -> None:
    """Classic consumers join a consumer group (classic members inside it); its only consumer-protocol member
    leaves: the group becomes a classic group again and the classic consumers carry on with every partition."""
    topic, group = unique("mixed-down"), unique("mixed-down-group")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic, PARTITIONS)
    async with coordinator(target, kafka_bootstrap) as port:
        bootstrap = f"127.0.0.1:{port}"
        modern = await ConsumerProcess("confluent", "modern", bootstrap, topic, group, "uniform",
                                       protocol="consumer").start()
        everyone = [modern]
        producer = Producer(bootstrap, topic)
        try:
            await wait_until(lambda: settled_assignment([modern]), TIMEOUT_S, "the consumer-protocol member")
            producer.start()
            classic = [await ConsumerProcess("confluent", f"classic-{i}", bootstrap, topic, group, "range",
                                             10_000).start() for i in range(2)]
            everyone += classic
            await wait_until(lambda: settled_assignment(everyone), TIMEOUT_S, "two classic members inside")
            types = sorted(int(m.member_type) for m in (await describe(port, group)).members)
            assert types == [0, 0, 1], types
            await modern.terminate()
            assert modern.closed, modern.stderr[-2000:]
            await wait_until(lambda: settled_assignment(classic), TIMEOUT_S, "the classic members after the downgrade")
            after = await describe(port, group)
            assert int(after.error_code) == 69, after  # GROUP_ID_NOT_FOUND: a classic group now
            await producer.stop()
            await wait_until(lambda: consumed(everyone) >= producer.values, TIMEOUT_S, "every record consumed")
            await wait_until(lambda: all_committed(port, group, topic, producer.next), TIMEOUT_S,
                             "committed == end offsets")
        finally:
            await producer.stop()
            await stop_all(everyone)
            for c in everyone:
                print(c.name, c.assigned, len(c.records), c.stderr.decode(errors="replace")[-1500:])


@pytest.mark.parametrize("target", ["ours", "kafka"])
async def test_downgrade_when_a_classic_static_member_replaces_the_last_consumer_protocol_member(
        kafka_bootstrap: str, target: str) -> None:
    """A static consumer-protocol member and a classic consumer share a topic; the static one stops (leaving for
    now, epoch -2) and a classic consumer with its group.instance.id and another subscription takes its place: the
    group becomes a classic group again and both classic consumers get their topics' partitions."""
    topic, other, group = unique("mixed-static"), unique("mixed-static-other"), unique("mixed-static-group")
    for name in (topic, other):
        await asyncio.to_thread(create_topic, kafka_bootstrap, name, PARTITIONS)
    async with coordinator(target, kafka_bootstrap) as port:
        bootstrap = f"127.0.0.1:{port}"
        static = {"group.instance.id": "replaced"}
        modern = await ConsumerProcess("confluent", "modern", bootstrap, topic, group, "uniform", settings=static,
                                       protocol="consumer").start()
        everyone = [modern]
        try:
            await wait_until(lambda: settled_assignment([modern]), TIMEOUT_S, "the consumer-protocol member")
            classic = await ConsumerProcess("confluent", "classic", bootstrap, topic, group, "range", 10_000).start()
            everyone.append(classic)
            await wait_until(lambda: settled_assignment(everyone), TIMEOUT_S, "a classic member inside")
            await modern.terminate()
            assert modern.closed, modern.stderr[-2000:]
            successor = await ConsumerProcess("confluent", "successor", bootstrap, other, group, "range", 10_000,
                                              settings=static).start()
            everyone.append(successor)
            await wait_until(lambda: sorted(successor.assigned) == list(range(PARTITIONS))
                             and sorted(classic.assigned) == list(range(PARTITIONS)), TIMEOUT_S,
                             "each classic consumer owning its topic")
            after = await describe(port, group)
            assert int(after.error_code) == 69, after  # GROUP_ID_NOT_FOUND: a classic group now
        finally:
            await stop_all(everyone)
            for c in everyone:
                print(c.name, c.assigned, len(c.records), c.stderr.decode(errors="replace")[-1500:])
