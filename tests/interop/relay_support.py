"""Shared by the relay tests: stock consumers in their own processes, topics and records in the real cluster,
and what our coordinator and the upstream cluster say about a group. (It holds no tests itself.)"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from coordinator.embedded.broker import free_port
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from tests.unit.test_server_env import request

RECORDS_PER_PARTITION = 100
FAST = ("group.initial.rebalance.delay.ms=0", "group.min.session.timeout.ms=1000")


async def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    """Poll `condition` until it returns something truthy (returned), or fail saying what did not happen."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


def relay_ports() -> tuple[int, int]:
    """(bootstrap port, relay base port) for a single broker of node id 1: its listener gets a free port too."""
    bootstrap = free_port()
    broker_listener = free_port()
    return bootstrap, broker_listener - 1


def create_topic(bootstrap: str, topic: str, partitions: int = 6) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def produce(bootstrap: str, topic: str, first: int, count: int, partitions: int = 6) -> dict[int, list[str]]:
    """`count` records to each partition (values "p<partition>-<n>"), acks=all, idempotent; returns the values."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5})
    values = {p: [f"p{p}-{n}" for n in range(first, first + count)] for p in range(partitions)}
    for partition, texts in values.items():
        for text in texts:
            producer.produce(topic, value=text.encode(), partition=partition)
    assert producer.flush(60) == 0, "records not delivered"
    return values


class ConsumerProcess:
    """One stock consumer (tests/interop/relay_consumer.py) in its own process, its JSON lines collected."""

    def __init__(self, kind: str, name: str, bootstrap: str, topic: str, group: str, assignor: str,
                 session_ms: int = 6_000) -> None:
        self.kind, self.name = kind, name
        self.command = [sys.executable, "-m", "tests.interop.relay_consumer", "--kind", kind, "--name", name,
                        "--bootstrap", bootstrap, "--topic", topic, "--group", group, "--assignor", assignor,
                        "--session-ms", str(session_ms)]
        self.assigned: list[int] = []
        self.records: list[tuple[int, int, str, bool]] = []  # (partition, offset, value, committed)
        self.closed = False
        self.process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self.stderr = b""

    async def start(self) -> ConsumerProcess:
        self.process = await asyncio.create_subprocess_exec(
            *self.command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while line := await self.process.stdout.readline():
            event = json.loads(line)
            if event["event"] == "assigned":
                self.assigned = event["partitions"]
            elif event["event"] == "consumed":
                self.records += [(p, o, v, event["committed"]) for p, o, v in event["records"]]
            elif event["event"] == "closed":
                self.closed = True

    def consumed(self, partition: int | None = None) -> list[tuple[int, int, str, bool]]:
        return [r for r in self.records if partition is None or r[0] == partition]

    async def terminate(self, timeout_s: float = 30) -> None:
        """SIGTERM: the consumer closes cleanly (LeaveGroup)."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.process.wait(), timeout_s)
        if self._reader is not None:
            await asyncio.wait_for(self._reader, timeout_s)

    async def kill(self) -> None:
        """SIGKILL: a crash; the group learns of it only when the session times out."""
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()

    async def stop(self) -> None:
        try:
            await self.terminate(20)
        except (asyncio.TimeoutError, ProcessLookupError):
            await self.kill()
        if self.process is not None and self.process.stderr is not None:
            self.stderr = await self.process.stderr.read()


async def start_consumers(specs: list[tuple[str, str]], bootstrap: str, topic: str, group: str,
                          assignor: str, session_ms: int = 6_000) -> list[ConsumerProcess]:
    return [await ConsumerProcess(kind, name, bootstrap, topic, group, assignor, session_ms).start()
            for kind, name in specs]


async def stop_all(consumers: list[ConsumerProcess]) -> None:
    await asyncio.gather(*(consumer.stop() for consumer in consumers), return_exceptions=True)


def settled_assignment(consumers: list[ConsumerProcess], partitions: int = 6) -> bool:
    """Every consumer owns something, nobody shares, and together they own every partition."""
    owned = [p for consumer in consumers for p in consumer.assigned]
    return all(consumer.assigned for consumer in consumers) and sorted(owned) == list(range(partitions))


async def committed_offsets(port: int, group: str, topic: str, partitions: int = 6) -> dict[int, int]:
    """OffsetFetch from our coordinator."""
    from tests.integration.test_e2e_support import fetch_offsets

    client = await KafkaClient.connect("127.0.0.1", port, client_id="relay-test")
    try:
        return await fetch_offsets(client, group, tuple(range(partitions)), topic=topic)
    finally:
        await client.close()


async def listed_groups(host: str, port: int) -> set[str]:
    client = await KafkaClient.connect(host, port, client_id="relay-test")
    try:
        response = await client.request(request(ApiKey.LIST_GROUPS, 4, states_filter=()))
        assert response.error_code == 0, response
        return {group.group_id for group in response.groups}
    finally:
        await client.close()


async def described_group(host: str, port: int, group: str) -> Any:
    from tests.integration.test_e2e_support import describe

    client = await KafkaClient.connect("127.0.0.1" if host == "localhost" else host, port, client_id="relay-test")
    try:
        return await describe(client, group)
    finally:
        await client.close()


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)
