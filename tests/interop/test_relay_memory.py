"""The relay's memory stays bounded: a client that pipelines fetches and never reads the responses holds at most
the relay buffer memory (the coordinator's RSS is measured), while another consumer keeps consuming through the
same relay; a response larger than the whole budget closes its connection with a log line."""

from __future__ import annotations

import asyncio
import datetime
import socket
import time

from confluent_kafka import Consumer, Producer

from protocol.codec import encode_request
from tests.support.relay import create_topic, relay_ports
from tests.support.polling import wait_until
from tests.support.service import FAST, service, unique
from tests.support.wire import nested, request

MIB = 1_048_576
CAP = 16 * MIB  # above the other consumer's largest fetch response (6 partitions x 1 MiB) plus what the stalled one holds
RECORDS_PER_PARTITION = 3_000
RECORD = b"x" * 1_000
STALLED_FETCHES = 100  # ~2 MB each: 200 MB if nothing bounded them


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def fill(bootstrap: str, topic: str) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "compression.type": "none"})
    for partition in range(6):
        for _ in range(RECORDS_PER_PARTITION):
            producer.produce(topic, RECORD, partition=partition)
            producer.poll(0)
    assert producer.flush(120) == 0
    return 6 * RECORDS_PER_PARTITION


def fetch_frame(correlation_id: int, topic: str, max_bytes: int, partition_max_bytes: int) -> bytes:
    partition = nested(1, 12, "topics", "partitions")
    partitions = tuple(partition(partition=p, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                                 log_start_offset=-1, partition_max_bytes=partition_max_bytes) for p in range(6))
    entry = nested(1, 12, "topics")(topic=topic, partitions=partitions)
    body = request(1, 12, replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1,
                   max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1, topics=(entry,),
                   forgotten_topics_data=(), rack_id="")
    return encode_request(correlation_id, "stalled-client", body)


def consume_all(bootstrap: str, topic: str, expected: int, timeout_s: float) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("relay-memory-reader"),
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen, deadline = 0, time.monotonic() + timeout_s
    try:
        while seen < expected and time.monotonic() < deadline:
            seen += sum(1 for m in consumer.consume(1_000, timeout=0.5) if m.error() is None)
    finally:
        consumer.close()
    return seen


async def test_a_client_that_never_reads_holds_at_most_the_cap_and_others_keep_working(kafka_bootstrap: str) -> None:
    topic = unique("relay-memory")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic)
    total = await asyncio.to_thread(fill, kafka_bootstrap, topic)
    port, base_port = relay_ports()
    args = ("--relay-base-port", str(base_port), "--relay-buffer-memory", str(CAP), "--relay-max-block-ms", "2000")
    async with service(kafka_bootstrap, unique("__state"), *FAST, listen=f"127.0.0.1:{port}", relay=True,
                       args=args) as running:
        broker_port = base_port + 1
        pid = running.process.pid
        baseline = rss_bytes(pid)
        stalled = socket.create_connection(("127.0.0.1", broker_port))
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65_536)
        try:
            for correlation_id in range(1, STALLED_FETCHES + 1):
                stalled.sendall(fetch_frame(correlation_id, topic, 2 * MIB, MIB))
            # meanwhile a stock consumer reads the whole topic through the same relay and broker listener
            seen = await asyncio.to_thread(consume_all, f"127.0.0.1:{port}", topic, total, 120)
            assert seen == total, f"the other consumer got {seen} of {total} records"
            peak = max([rss_bytes(pid) for _ in range(10) if not time.sleep(0.1)])
            growth = peak - baseline
            print(f"relay memory: RSS {baseline / MIB:.1f} -> {peak / MIB:.1f} MiB (growth {growth / MIB:.1f} MiB, "
                  f"cap {CAP / MIB:.0f} MiB, {STALLED_FETCHES} unread fetches of up to 2 MiB)")
            assert growth < CAP + 24 * MIB, f"RSS grew by {growth / MIB:.1f} MiB with a {CAP / MIB:.0f} MiB cap"
        finally:
            stalled.close()

        # a single response larger than the whole budget: its connection is closed, with a log line
        too_big = socket.create_connection(("127.0.0.1", broker_port))
        try:
            too_big.sendall(fetch_frame(1, topic, 64 * MIB, 16 * MIB))
            too_big.settimeout(30)
            assert too_big.recv(4) == b"", "the connection should have been closed"
        finally:
            too_big.close()
        await wait_until(lambda: "reason=relay_buffer_exhausted" in running.log_text(), 10, "the log line")
        assert "exceeds the relay buffer memory" in running.log_text()
