"""The relay's listeners are untrusted input too (issue 13): the mutation fuzzer (tests/fuzz) against a real
`coordinator serve` in front of the real broker, on its bootstrap listener and on a broker's listener at once.

The corpus holds what the relay advertises for the relayed and rewritten APIs (Produce, Fetch, ListOffsets,
Metadata, FindCoordinator) and the local ones (ApiVersions and the group APIs), each at its lowest and highest
advertised version. While it runs a control member heartbeats on the bootstrap listener and a stock producer and
consumer (confluent-kafka, bootstrapped at the relay) make produce+fetch round trips through it. At the end:
no traceback or ERROR line in the service's log, every heartbeat NONE, every round trip delivered, the service
alive within an RSS bound, and the upstream broker still answering Metadata with the control topic's leader.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from protocol.apis import ApiKey
from protocol.client import KafkaClient
from tests.fuzz.corpus import known_ranges
from tests.fuzz.runner import ERROR_LINE, FuzzConfig, FuzzReport, run_fuzz
from tests.support.relay import create_topic, split_address
from tests.support.service import FAST, service, unique, until_loaded
from tests.support.wire import request

pytestmark = pytest.mark.integration

FRAMES_PER_LISTENER = 12_000  # 24,000 in all
SEEDS = {"bootstrap": 15, "broker": 16}
RSS_GROWTH_BOUND_KB = 32_768  # from the warmed-up service (relay links and pools allocated) to the end
PRODUCE, FETCH, LIST_OFFSETS = 0, 1, 2  # relayed byte for byte (protocol.apis.ApiKey names only ours)
RELAYED_AND_REWRITTEN = (PRODUCE, FETCH, LIST_OFFSETS, ApiKey.METADATA, ApiKey.FIND_COORDINATOR)
LOCAL = (ApiKey.API_VERSIONS, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP,
         ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.DESCRIBE_GROUPS, ApiKey.LIST_GROUPS,
         ApiKey.DELETE_GROUPS, ApiKey.OFFSET_DELETE)


def relay_corpus(advertised: dict[int, tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(key, min, max) for every corpus API the relay advertises, at the relay's own ranges."""
    wanted = [int(key) for key in (*RELAYED_AND_REWRITTEN, *LOCAL)]
    return known_ranges([(key, *advertised[key]) for key in wanted if key in advertised])


class RoundTrips:
    """A stock producer and an assign()-ed consumer bootstrapped at the relay: each round produces one record
    and reads it back (bounded), in a thread, until stopped."""

    def __init__(self, relay_bootstrap: str, topic: str) -> None:
        self.topic = topic
        common = {"bootstrap.servers": relay_bootstrap, "socket.timeout.ms": 10_000}
        self.producer = Producer({**common, "acks": "all", "linger.ms": 0})
        self.consumer = Consumer({**common, "group.id": unique("fuzz-roundtrip"), "enable.auto.commit": False,
                                  "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
        self.consumer.assign([TopicPartition(topic, 0, 0)])
        self.delivered: list[float] = []  # seconds per round trip
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._sent = 0

    def round(self, timeout_s: float = 30.0) -> bool:
        value = f"round-{self._sent}".encode()
        self._sent += 1
        started = time.monotonic()
        self.producer.produce(self.topic, value=value, partition=0)
        if self.producer.flush(timeout_s) != 0:
            self.failures.append(f"{value!r} not delivered")
            return False
        while time.monotonic() - started < timeout_s:
            message = self.consumer.poll(0.5)
            if message is not None and message.error() is None and message.value() == value:
                self.delivered.append(time.monotonic() - started)
                return True
        self.failures.append(f"{value!r} not read back")
        return False

    def run(self) -> None:
        while not self._stop.is_set():
            self.round()
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.producer.flush(10)
        self.consumer.close()


def distinct_failures(log_text: str) -> list[str]:
    """Each distinct traceback once (its frames and its exception line), for a failure message."""
    seen: dict[str, int] = {}
    for block in log_text.split("Traceback (most recent call last):")[1:]:
        lines = []
        for line in block.splitlines()[1:]:
            if re.match(r"^\d{4}-\d\d-\d\d ", line):
                break
            lines.append(line.strip())
        key = " | ".join(lines)
        seen[key] = seen.get(key, 0) + 1
    return [f"{count}x {key}" for key, count in seen.items()]


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


async def test_fuzzing_both_relay_listeners_breaks_neither_the_service_nor_the_upstream_path(
        kafka_bootstrap: str) -> None:
    topic = unique("relay-fuzz-control")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic, 1)
    async with service(kafka_bootstrap, unique("__state"), *FAST, relay=True) as running:
        client = await running.client()
        await until_loaded(client)
        advertised = dict(client.api_versions)
        metadata = await client.request(request(ApiKey.METADATA, 12, topics=None, allow_auto_topic_creation=False,
                                                include_topic_authorized_operations=False))
        broker_port = next(b.port for b in metadata.brokers if b.port != running.port)
        await client.close()
        corpus = relay_corpus(advertised)
        assert {PRODUCE, FETCH, LIST_OFFSETS, ApiKey.METADATA, ApiKey.API_VERSIONS} <= {k for k, _, _ in corpus}

        trips = RoundTrips(f"127.0.0.1:{running.port}", topic)
        during = threading.Thread(target=trips.run, daemon=True)
        try:
            assert await asyncio.to_thread(trips.round, 60.0), trips.failures  # warm-up: the path works at all
            rss_start_kb = _rss_kb(running.process.pid)
            during.start()

            async def sample_rss(_index: int, _report: FuzzReport) -> dict:
                return {"rss_kb": _rss_kb(running.process.pid)}

            def config(port: int, seed: int, control: tuple | None) -> FuzzConfig:
                return FuzzConfig(target=("127.0.0.1", port), frames=FRAMES_PER_LISTENER, seed=seed,
                                  corpus=corpus, concurrency=8, max_batch=6, control=control, waves=4,
                                  on_wave=sample_rss, reply_timeout_s=20.0)

            try:
                bootstrap_report, broker_report = await asyncio.gather(
                    run_fuzz(config(running.port, SEEDS["bootstrap"], None)),  # control group on the bootstrap
                    run_fuzz(config(broker_port, SEEDS["broker"], ())))
            finally:
                trips.stop()
                if during.is_alive():
                    await asyncio.to_thread(during.join, 60)
            rounds_during = len(trips.delivered) - 1
            final_round = await asyncio.to_thread(trips.round, 60.0)
        finally:
            await asyncio.to_thread(trips.close)

        # the relay still answers Metadata with both listeners, and the broker's listener still relays
        after = await KafkaClient.connect("127.0.0.1", broker_port, client_id="fuzz-after", timeout_ms=30_000)
        described = await after.request(request(ApiKey.METADATA, 12, topics=None, allow_auto_topic_creation=False,
                                                 include_topic_authorized_operations=False))
        await after.close()
        alive = running.process.returncode is None
        rss_end_kb = _rss_kb(running.process.pid) if alive else -1
        log_text = running.log_text()

    upstream_host, upstream_port = split_address(kafka_bootstrap.split(",")[0])
    upstream = await KafkaClient.connect(upstream_host, upstream_port, client_id="fuzz-upstream", timeout_ms=30_000)
    direct = await upstream.request(request(ApiKey.METADATA, 12, topics=None, allow_auto_topic_creation=False,
                                            include_topic_authorized_operations=False))
    await upstream.close()

    summaries = {"bootstrap": bootstrap_report.summary(), "broker": broker_report.summary(),
                 "rss_start_kb": rss_start_kb, "rss_end_kb": rss_end_kb, "round_trips_during": rounds_during}
    tracebacks, errors = log_text.count("Traceback"), ERROR_LINE.findall(log_text)
    assert alive, summaries
    assert tracebacks == 0 and not errors, (tracebacks, len(errors), distinct_failures(log_text))
    for report in (bootstrap_report, broker_report):
        assert report.frames == FRAMES_PER_LISTENER and report.hangs == 0 and report.refused == 0, summaries
        assert report.responses > FRAMES_PER_LISTENER // 20, summaries  # requests reached the handlers/broker
    assert bootstrap_report.control_beats >= 10 and not bootstrap_report.control_errors, summaries
    assert final_round and not trips.failures and rounds_during >= 1, (trips.failures, summaries)
    assert {b.port for b in described.brokers} == {running.port, broker_port}, described
    assert rss_end_kb - rss_start_kb <= RSS_GROWTH_BOUND_KB, summaries
    control = next(t for t in direct.topics if t.name == topic)
    assert control.error_code == 0 and control.partitions[0].leader_id >= 0, control
