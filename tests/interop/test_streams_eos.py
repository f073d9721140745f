"""A Kafka Streams `exactly_once_v2` application (kafka-streams 4.1.1, tests/support/java/streams) through the
coordinator (relay on), and the same application straight against Kafka: two instances (JVMs) count the records
of each key of an input topic while one instance is SIGKILLed and restarted and, through us, the coordinator is
SIGKILLed and restarted on the same ports. With the record cache off every input record gives one count update,
so exactly-once means the read_committed output holds (key, 1..n) once each, and the group's committed offsets
reach the input's end."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from coordinator.embedded.broker import die_with_parent
from coordinator.embedded.jars import JarSet
from tests.support.eos_loop import read_committed_consumer
from tests.support.polling import wait_until
from tests.support.relay import create_topic, relay_ports
from tests.support.service import FAST, Service, service, unique, until_loaded

log = logging.getLogger(__name__)
pytestmark = [pytest.mark.integration, pytest.mark.interop]

JAVA_DIR = Path(__file__).parents[1] / "support" / "java"
APP_DIR = JAVA_DIR / "streams"
# Maven fetches these once per machine (~95 MB, RocksDB's native jar most of it), on the first run of this test
STREAMS_JARS = JarSet("streams-eos", APP_DIR / "pom.xml", "kafka.streams.version", "kafka-streams-*.jar")
KEYS = 12
PER_KEY = 60
RECORDS = KEYS * PER_KEY
PARTITIONS = 4
RATE_PER_S = 60  # input records written per second: the kills land while the application is processing
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def streams_command(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The java command line of StreamsEos, compiled once per module against the pinned kafka-streams jars."""
    jars = STREAMS_JARS.ensure()
    classes = tmp_path_factory.mktemp("streams-eos-classes")
    javac = shutil.which("javac")
    assert javac is not None, "javac is not on PATH (a JDK 17+ is needed to build the Streams application)"
    compiled = subprocess.run([javac, "-nowarn", "-cp", f"{jars}/*", "-d", str(classes),
                               str(APP_DIR / "StreamsEos.java")], capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    return [shutil.which("java") or "java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={JAVA_DIR / 'log4j2.properties'}", "-cp", f"{jars}/*:{classes}",
            "StreamsEos"]


class StreamsInstance:
    """One JVM of the application; its "STATE <state>" lines are collected by a reader thread."""

    def __init__(self, command: list[str], state_dir: Path) -> None:
        self._stderr = tempfile.TemporaryFile()
        # started from the event loop's thread: die_with_parent ties the JVM to the thread that forks it
        self.process = subprocess.Popen([*command, str(state_dir)], stdout=subprocess.PIPE, stderr=self._stderr,
                                        text=True, preexec_fn=die_with_parent)  # noqa: PLW1509
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def running(self) -> bool:
        return bool(self.lines) and self.lines[-1] == "STATE RUNNING" and self.process.poll() is None

    def failures(self) -> list[str]:
        return [line for line in self.lines if line.startswith("FAILED") or line == "STATE ERROR"]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)
        self._reader.join(10)

    def diagnostics(self) -> str:
        self._stderr.seek(0)
        return f"exit={self.process.poll()} lines={self.lines[-10:]}\n{self._stderr.read().decode()[-3000:]}"


class InputWriter(threading.Thread):
    """Writes the input, record i keyed k<i % KEYS>, at RATE_PER_S, never past `allowed` (the test raises it)."""

    def __init__(self, kafka: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.kafka, self.topic = kafka, topic
        self.allowed = 0
        self.written = 0
        self.flushed = False  # all RECORDS written and acknowledged
        self.stopped = False
        self._gate = threading.Condition()

    def allow(self, count: int) -> None:
        with self._gate:
            self.allowed = count
            self._gate.notify_all()

    def stop(self) -> None:
        with self._gate:
            self.stopped = True
            self._gate.notify_all()
        self.join(30)

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.kafka, "linger.ms": 0})
        started = time.monotonic()
        while self.written < RECORDS:
            with self._gate:
                while self.written >= self.allowed and not self.stopped:
                    self._gate.wait()
                    started = time.monotonic() - self.written / RATE_PER_S  # the rate counts from the release
                if self.stopped:
                    break
            due = started + self.written / RATE_PER_S
            if due > time.monotonic():
                time.sleep(due - time.monotonic())  # pacing the writes, not waiting for a condition
            producer.produce(self.topic, key=f"k{self.written % KEYS}".encode(), value=str(self.written).encode())
            producer.poll(0)
            self.written += 1
        assert producer.flush(30) == 0
        self.flushed = self.written == RECORDS


class OutputReader(threading.Thread):
    """Follows the output topic read_committed from the beginning (the run's progress): (key, count) updates."""

    def __init__(self, kafka: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.updates: list[tuple[str, int]] = []
        self.stopped = False
        self._consumer = Consumer({"bootstrap.servers": kafka, "group.id": unique("streams-reader"),
                                   "enable.auto.commit": False, "isolation.level": "read_committed"})
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self.topic = topic

    def run(self) -> None:
        while not self.stopped:
            message = self._consumer.poll(0.2)
            if message is not None and message.error() is None:
                self.updates.append((message.key().decode(), int(message.value().decode())))

    def stop(self) -> None:
        self.stopped = True
        self.join(30)
        self._consumer.close()


def committed_output(kafka: str, topic: str, timeout_s: float = 60) -> list[tuple[str, int]]:
    """The output topic read_committed from the beginning to its current end: every (key, count) update. The end
    is each partition's high watermark, asked first; read_committed reaches it once every transaction before it
    is settled (the consumer's fetch position then passes the last marker, reported with PARTITION_EOF)."""
    ends = topic_ends(kafka, topic)
    reader = Consumer({"bootstrap.servers": kafka, "group.id": unique("streams-final"), "enable.auto.commit": False,
                       "isolation.level": "read_committed", "enable.partition.eof": True})
    reader.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    updates: list[tuple[str, int]] = []
    reached: dict[int, int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while any(reached.get(p, -1) < end for p, end in ends.items()):
            assert time.monotonic() < deadline, f"the output not read to its end {ends} in {timeout_s} s: {reached}"
            message = reader.poll(0.2)
            if message is None:
                continue
            if message.error() is None:
                updates.append((message.key().decode(), int(message.value().decode())))
            elif message.error().code() == KafkaError._PARTITION_EOF:
                reached[message.partition()] = message.offset()
        return updates
    finally:
        reader.close()


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets as a read_committed consumer asks them (OffsetFetch with require_stable)."""
    reader = read_committed_consumer(bootstrap, group)
    try:
        answer = reader.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
        return {tp.partition: tp.offset for tp in answer}
    finally:
        reader.close()


def topic_ends(kafka: str, topic: str) -> dict[int, int]:
    reader = Consumer({"bootstrap.servers": kafka, "group.id": unique("streams-ends")})
    try:
        return {p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        reader.close()


async def counting_app_run(bootstrap: str, kafka: str, command: list[str], state_root: Path,
                           restart_coordinator: Callable[[], Awaitable[None]] | None) -> list[tuple[str, int]]:
    """Two instances of the counting application over RECORDS input records: instance b SIGKILLed and restarted
    (with its state directory) at 15% of the output, `restart_coordinator` (if any) run at 60%. Returns the read_committed output's updates
    once the group's committed offsets are at the input's end."""
    application, source, sink = unique("streams-eos"), unique("streams-in"), unique("streams-out")
    for topic in (source, sink):
        await asyncio.to_thread(create_topic, kafka, topic, PARTITIONS)
    writer, reader = InputWriter(kafka, source), OutputReader(kafka, sink)
    writer.start()
    reader.start()
    app = [*command, bootstrap, application, source, sink]
    instances: dict[str, StreamsInstance] = {}

    def failures() -> str:
        return "\n".join(f"{name}: {instance.diagnostics()}" for name, instance in instances.items())

    async def until(condition: Callable[[], object], what: str) -> None:
        log.info("event=streams_eos_waiting for=%r output=%d written=%d", what, len(reader.updates), writer.written)
        try:
            await wait_until(condition, TIMEOUT_S, what, interval_s=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; output {len(reader.updates)}, written {writer.written}\n{failures()}")

    try:
        for name in ("a", "b"):
            instances[name] = StreamsInstance(app, state_root / name)
        await until(lambda: all(instance.running for instance in instances.values()), "both instances running")
        writer.allow(RECORDS * 2 // 5)
        await until(lambda: len(reader.updates) >= RECORDS * 15 // 100, "15% of the output")
        instances["b"].kill()
        instances["b"] = StreamsInstance(app, state_root / "b")  # its state directory: the same process id
        await until(lambda: len(reader.updates) >= RECORDS * 35 // 100, "35% of the output")
        await until(lambda: instances["b"].running, "the restarted instance running")
        writer.allow(RECORDS)
        await until(lambda: len(reader.updates) >= RECORDS * 60 // 100, "60% of the output")
        assert writer.written < RECORDS, "the input was all written before the coordinator's kill"
        if restart_coordinator is not None:
            await restart_coordinator()
        await until(lambda: writer.flushed, "the whole input written")
        ends = await asyncio.to_thread(topic_ends, kafka, source)
        assert sum(ends.values()) == RECORDS

        async def offsets_at_end() -> bool:
            return await asyncio.to_thread(committed_offsets, bootstrap, application, source) == ends

        await until(offsets_at_end, "the group's committed offsets at the input's end")
        assert not [line for instance in instances.values() for line in instance.failures()], failures()
        return await asyncio.to_thread(committed_output, kafka, sink)
    finally:
        for instance in instances.values():
            instance.kill()
        writer.stop()
        reader.stop()


def assert_exactly_once(updates: list[tuple[str, int]]) -> None:
    seen = Counter(updates)
    twice = sorted(update for update, times in seen.items() if times > 1)
    assert not twice, f"count updates in the committed output more than once: {twice[:20]}"
    expected = {(f"k{key}", count) for key in range(KEYS) for count in range(1, PER_KEY + 1)}
    assert set(seen) == expected, (f"missing {sorted(expected - set(seen))[:20]}, "
                                   f"unexpected {sorted(set(seen) - expected)[:20]}")


@asynccontextmanager
async def restartable_coordinator(kafka: str) -> AsyncIterator[tuple[str, Callable[[], Awaitable[None]]]]:
    """The coordinator with its relay on fixed ports; the callable SIGKILLs it and starts a new one on the same
    ports and state topic (the clients reconnect to the same addresses)."""
    port, base_port = relay_ports()
    state_topic = unique("__state-streams")
    options = dict(listen=f"127.0.0.1:{port}", relay=True, args=("--relay-base-port", str(base_port)))
    async with AsyncExitStack() as stack:
        async def start() -> Service:
            running = await stack.enter_async_context(service(kafka, state_topic, *FAST, **options))  # type: ignore[arg-type]
            client = await running.client()
            try:
                await until_loaded(client)
            finally:
                await client.close()
            return running

        current = [await start()]

        async def restart() -> None:
            current[0].process.kill()
            await current[0].process.wait()
            current[0] = await start()

        yield f"127.0.0.1:{port}", restart


@pytest.fixture
def state_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="streams-eos-") as directory:
        yield Path(directory)


async def test_a_streams_application_against_kafka_counts_exactly_once(kafka_bootstrap: str,
                                                                       streams_command: list[str],
                                                                       state_root: Path) -> None:
    """The comparison: the same application and kills straight against Kafka (no coordinator)."""
    updates = await counting_app_run(kafka_bootstrap, kafka_bootstrap, streams_command, state_root, None)
    assert_exactly_once(updates)


async def test_a_streams_application_through_us_counts_exactly_once(kafka_bootstrap: str,
                                                                    streams_command: list[str],
                                                                    state_root: Path) -> None:
    """Through the coordinator: an instance SIGKILLed and restarted, the coordinator SIGKILLed and restarted."""
    async with restartable_coordinator(kafka_bootstrap) as (bootstrap, restart):
        updates = await counting_app_run(bootstrap, kafka_bootstrap, streams_command, state_root, restart)
    assert_exactly_once(updates)
