"""Restarts under running consumers, through the relay: the coordinator restarted on the same ports (the
consumers reconnect, the group and its offsets are reloaded, nothing committed is lost, consumption resumes),
then the upstream broker restarted (the relay reconnects, the consumers resume)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from coordinator.embedded import EmbeddedKafka
from tests.support.relay import (committed_offsets, create_topic, produce, relay_ports, settled_assignment,
                                 start_consumers, stop_all)
from tests.support.polling import wait_until
from tests.support.service import FAST, service, unique

TIMEOUT_S = 120
BATCH = 30


def values_of(produced: dict[int, list[str]]) -> set[str]:
    return {value for values in produced.values() for value in values}


def consumed(consumers: list) -> Counter:
    return Counter(value for consumer in consumers for _p, _o, value, _c in consumer.records)


async def test_consumers_survive_a_coordinator_restart_and_a_broker_restart(restartable_kafka: EmbeddedKafka) -> None:
    cluster = restartable_kafka.bootstrap
    topic, group, state_topic = unique("relay-restart"), unique("relay-restart-group"), unique("__state")
    await asyncio.to_thread(create_topic, cluster, topic)
    port, base_port = relay_ports()
    options = dict(listen=f"127.0.0.1:{port}", relay=True, args=("--relay-base-port", str(base_port)))
    bootstrap = f"127.0.0.1:{port}"
    consumers = []
    try:
        async with service(cluster, state_topic, *FAST, **options) as first:  # type: ignore[arg-type]
            consumers = await start_consumers([("confluent", "rdk-a"), ("confluent", "rdk-b"), ("aiokafka", "aio-c")],
                                              bootstrap, topic, group, "range", session_ms=20_000)
            await wait_until(lambda: settled_assignment(consumers), TIMEOUT_S, "three consumers settled")
            expected = values_of(await asyncio.to_thread(produce, cluster, topic, 0, BATCH))
            await wait_until(lambda: set(consumed(consumers)) >= expected, TIMEOUT_S, "the first batch")
            await _until_committed(first.port, group, topic, BATCH)
            assert await first.terminate() == 0

        async with service(cluster, state_topic, *FAST, **options) as second:  # type: ignore[arg-type]
            before = await _until_loaded_offsets(second.port, group, topic)
            assert before == {p: BATCH for p in range(6)}, f"committed offsets lost in the restart: {before}"
            expected |= values_of(await asyncio.to_thread(produce, cluster, topic, BATCH, BATCH))
            await wait_until(lambda: set(consumed(consumers)) >= expected, TIMEOUT_S, "the batch after the restart")
            await _until_committed(second.port, group, topic, 2 * BATCH)
            twice = {value for value, n in consumed(consumers).items() if n > 1}
            assert not twice, f"records of committed offsets consumed again: {sorted(twice)[:10]}"

            await restartable_kafka.stop()
            await restartable_kafka.start()
            expected |= values_of(await asyncio.to_thread(produce, cluster, topic, 2 * BATCH, BATCH))
            await wait_until(lambda: set(consumed(consumers)) >= expected, TIMEOUT_S,
                             "the batch after the broker restart")
            await _until_committed(second.port, group, topic, 3 * BATCH)
            assert "upstream_closed" in second.log_text() or "upstream_unreachable" in second.log_text()
    finally:
        await stop_all(consumers)


async def _until_loaded_offsets(port: int, group: str, topic: str, timeout_s: float = 120) -> dict[int, int]:
    deadline = time.monotonic() + timeout_s  # a restart on a loaded machine: bounded by time, not tries
    while True:
        try:
            return await committed_offsets(port, group, topic)
        except AssertionError:  # COORDINATOR_LOAD_IN_PROGRESS while the state topic is read
            assert time.monotonic() < deadline, "the coordinator never loaded its state"
            await asyncio.sleep(0.1)


async def _until_committed(port: int, group: str, topic: str, offset: int) -> None:
    for _ in range(600):
        try:
            if await committed_offsets(port, group, topic) == {p: offset for p in range(6)}:
                return
        except (AssertionError, OSError):
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"offsets never all committed at {offset}: {await committed_offsets(port, group, topic)}")
