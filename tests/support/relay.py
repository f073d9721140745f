"""For the relay tests: stock consumers in their own processes, topics and records in the real cluster, and what
our coordinator and the upstream cluster say about a group."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from protocol.apis import ApiKey
from protocol.client import KafkaClient
from tests.support.polling import wait_until
from tests.support.ports import free_port, free_run
from tests.support.wire import request

RECORDS_PER_PARTITION = 100


def relay_ports(brokers: int = 1) -> tuple[int, int]:
    """(bootstrap port, relay base port) for brokers of node ids 1..brokers: base + id are free ports too."""
    return free_port(), free_run(brokers) - 1


def create_topic(bootstrap: str, topic: str, partitions: int = 6, replication: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, replication)])[topic].result(30)


def partition_leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> leader node id, as Metadata (through the relay or not) tells it."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return {p.id: p.leader for p in metadata.topics[topic].partitions.values()}


def brokers_seen(bootstrap: str) -> dict[int, tuple[str, int]]:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    return {b.id: (b.host, b.port) for b in metadata.brokers.values()}


def produce(bootstrap: str, topic: str, first: int, count: int, partitions: int = 6) -> dict[int, list[str]]:
    """`count` records to each partition (values "p<partition>-<n>"), acks=all, idempotent; returns the values."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5})
    values = {p: [f"p{p}-{n}" for n in range(first, first + count)] for p in range(partitions)}
    for partition, texts in values.items():
        for text in texts:
            producer.produce(topic, key=text.encode(), value=text.encode(), partition=partition)
    assert producer.flush(60) == 0, "records not delivered"
    return values


class ConsumerProcess:
    """One stock consumer (tests/support/relay_consumer.py) in its own process, its JSON lines collected."""

    def __init__(self, kind: str, name: str, bootstrap: str, topic: str, group: str, assignor: str,
                 session_ms: int = 6_000, *, settings: dict[str, str] | None = None, protocol: str = "classic"
                 ) -> None:
        self.kind, self.name = kind, name
        self.command = [sys.executable, "-m", "tests.support.relay_consumer", "--kind", kind, "--name", name,
                        "--bootstrap", bootstrap, "--topic", topic, "--group", group, "--assignor", assignor,
                        "--session-ms", str(session_ms), "--protocol", protocol,
                        *(arg for key, value in (settings or {}).items() for arg in ("--setting", f"{key}={value}"))]
        self.assigned: list[int] = []
        self.records: list[tuple[int, int, str, bool]] = []  # (partition, offset, value, committed)
        self.closed = False
        self.process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._stderr_reader: asyncio.Task | None = None
        self._stderr = bytearray()
        self.stderr = b""

    async def start(self) -> ConsumerProcess:
        self.process = await asyncio.create_subprocess_exec(
            *self.command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._reader = asyncio.get_running_loop().create_task(self._read())
        # drained as it comes: librdkafka's log lines during a broker restart fill a pipe's 64 KiB, and a
        # consumer blocked writing its stderr stops consuming (and does not stop on SIGTERM)
        self._stderr_reader = asyncio.get_running_loop().create_task(self._drain_stderr())
        return self

    async def _drain_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        while chunk := await self.process.stderr.read(65_536):
            self._stderr += chunk

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
        if self._stderr_reader is not None:
            try:  # the process is gone: its stderr ends (bounded all the same)
                await asyncio.wait_for(self._stderr_reader, 20)
            except asyncio.TimeoutError:
                pass
        self.stderr = bytes(self._stderr)


class JavaMember:
    """Kafka's Java consumer (tests/support/java_consumer.py) seen through the ConsumerProcess interface; records
    carry their key, which the producers here set to the value."""

    kind = "java"

    def __init__(self, name: str, bootstrap: str, topic: str, group: str, assignor: str, session_ms: int,
                 protocol: str = "classic") -> None:
        from tests.support.java_consumer import JavaConsumer

        self.name = name
        self.consumer = JavaConsumer(bootstrap, group, topic, assignor=assignor, session_timeout_ms=session_ms,
                                     heartbeat_interval_ms=max(session_ms // 6, 100), client_id=name,
                                     group_protocol=protocol)
        self.stderr = b""

    async def start(self) -> JavaMember:
        return self

    @property
    def assigned(self) -> list[int]:
        return sorted(partition for _topic, partition in self.consumer.assignment)

    @property
    def records(self) -> list[tuple[int, int, str, bool]]:
        failed = any(event.startswith("COMMIT_FAILED") for event in self.consumer.events)
        return [(r.partition, r.offset, r.key or "", not failed) for r in list(self.consumer.records)]

    @property
    def closed(self) -> bool:
        return self.consumer.closed

    async def kill(self) -> None:
        await asyncio.to_thread(self.consumer.kill)

    async def terminate(self, timeout_s: float = 30) -> None:
        await asyncio.to_thread(self.consumer.terminate, timeout_s)

    async def stop(self) -> None:
        await asyncio.to_thread(self.consumer.close, 30)
        self.stderr = self.consumer.diagnostics().encode()


async def start_consumers(specs: list[tuple[str, str]], bootstrap: str, topic: str, group: str,
                          assignor: str, session_ms: int = 6_000, protocol: str = "classic") -> list[Any]:
    started: list[Any] = []
    for kind, name in specs:
        if kind == "java":
            started.append(await asyncio.to_thread(JavaMember, name, bootstrap, topic, group, assignor, session_ms,
                                                   protocol))
        else:
            started.append(await ConsumerProcess(kind, name, bootstrap, topic, group, assignor, session_ms,
                                                 protocol=protocol).start())
    return started


async def stop_all(consumers: list[ConsumerProcess]) -> None:
    await asyncio.gather(*(consumer.stop() for consumer in consumers), return_exceptions=True)


def settled_assignment(consumers: list[ConsumerProcess], partitions: int = 6) -> bool:
    """Every consumer owns something, nobody shares, and together they own every partition."""
    owned = [p for consumer in consumers for p in consumer.assigned]
    return all(consumer.assigned for consumer in consumers) and sorted(owned) == list(range(partitions))


async def committed_offsets(port: int, group: str, topic: str, partitions: int = 6) -> dict[int, int]:
    """OffsetFetch from our coordinator."""
    from tests.support.service import fetch_offsets

    client = await KafkaClient.connect("127.0.0.1", port, client_id="relay-test")
    try:
        return await fetch_offsets(client, group, tuple(range(partitions)), topic=topic)
    finally:
        await client.close()


async def committed_reaching(port: int, group: str, topic: str, expected: dict[int, int], timeout_s: float,
                             partitions: int = 6) -> dict[int, int]:
    """The group's committed offsets once they equal `expected` (bounded): a consumer prints a record before it
    commits it, so every record seen does not yet mean every offset committed."""
    last: dict[int, int] = {}

    async def reached() -> bool:
        nonlocal last
        last = await committed_offsets(port, group, topic, partitions)
        return last == expected

    try:
        await wait_until(reached, timeout_s, f"committed offsets {expected}", interval_s=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last committed {last}") from None
    return last


async def listed_groups(host: str, port: int) -> set[str]:
    client = await KafkaClient.connect(host, port, client_id="relay-test")
    try:
        response = await client.request(request(ApiKey.LIST_GROUPS, 4, states_filter=()))
        assert response.error_code == 0, response
        return {group.group_id for group in response.groups}
    finally:
        await client.close()


async def described_group(host: str, port: int, group: str) -> Any:
    from tests.support.service import describe

    client = await KafkaClient.connect("127.0.0.1" if host == "localhost" else host, port, client_id="relay-test")
    try:
        return await describe(client, group)
    finally:
        await client.close()


async def consumer_group_described(port: int, group: str) -> Any:
    """ConsumerGroupDescribe v1 of one group, from whoever listens on `port`."""
    client = await KafkaClient.connect("127.0.0.1", port, client_id="kip848-test")
    try:
        return (await client.request(request(ApiKey.CONSUMER_GROUP_DESCRIBE, 1, group_ids=(group,),
                                             include_authorized_operations=False))).groups[0]
    finally:
        await client.close()


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def check_exactly_once(consumers: list, produced: dict[int, list[str]]) -> None:
    counts = Counter(value for consumer in consumers for _p, _o, value, _c in consumer.records)
    duplicates = {value: n for value, n in counts.items() if n > 1}
    assert not duplicates, f"consumed more than once: {sorted(duplicates)[:10]}"
    expected = {value for values in produced.values() for value in values}
    assert set(counts) == expected, f"missing: {sorted(expected - set(counts))[:10]}"
    for consumer in consumers:
        wrong = {p for p, _o, _v, _c in consumer.records if p not in consumer.assigned}
        assert not wrong, f"{consumer.name} consumed partitions {wrong} it does not own ({consumer.assigned})"
        assert all(committed for *_rest, committed in consumer.records), f"{consumer.name}: a commit failed"
