"""Relay benchmark: what fronting the cluster costs a consumer and a producer, against the same broker direct.

  python -m bench.relay [--megabytes 200] [--repeats 3] [--round-trips 2000] [--quick]

Against a real Apache Kafka broker (the embedded one unless KAFKA_BOOTSTRAP is set) and `coordinator serve` with
the relay on (a subprocess, its default event loop), same run, same data:
(a) Fetch throughput: a confluent-kafka (librdkafka) consumer assigned every partition of a 6-partition topic
    of --megabytes of 1 KiB records reads it all from the beginning, directly from the broker and through the
    relay, alternating, --repeats times each. MB/s and records/s per path (medians), their ratio, and the
    coordinator's CPU time per MB relayed (from /proc). Target: ratio >= 0.8.
(b) Produce round trips: a confluent-kafka producer (acks=all, idempotent, linger.ms=0) sends one 100-byte
    record and waits for its delivery report, --round-trips times per path, alternating blocks of 200.
    p50/p99 per path and the relay's added p99. Target: added p99 <= 1 ms.
The last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.kafka import bench_kafka_blocking
from coordinator.embedded.ports import free_port

RECORD_BYTES = 1_024
PARTITIONS = 6
BLOCK = 200  # produce round trips per block (blocks of the two paths alternate)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def fill(bootstrap: str, topic: str, megabytes: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept referenced until the result is in
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                         "compression.type": "none", "queue.buffering.max.kbytes": 262_144})
    count = megabytes * 1_048_576 // RECORD_BYTES
    payload = os.urandom(RECORD_BYTES)
    for index in range(count):
        while True:
            try:
                producer.produce(topic, payload, partition=index % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
        if index % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0
    return count


def read_all(bootstrap: str, topic: str, records: int) -> tuple[float, int]:
    """(seconds, bytes) for one consumer reading every record from the beginning."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    seen = size = 0
    started = time.perf_counter()
    deadline = started + 600
    try:
        while seen < records and time.perf_counter() < deadline:
            for message in consumer.consume(10_000, timeout=1.0):
                if message.error() is None:
                    seen += 1
                    size += len(message.value() or b"")
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    if seen < records:
        raise RuntimeError(f"read {seen} of {records} records via {bootstrap}")
    return elapsed, size


def round_trips(producer: Producer, topic: str, count: int) -> list[float]:
    latencies: list[float] = []
    payload = b"r" * 100
    for _ in range(count):
        started = time.perf_counter()
        producer.produce(topic, payload, partition=0)
        producer.flush(30)
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def start_coordinator(cluster: str, port: int, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "coordinator.cli", "--log-level", "WARNING", "serve",
               "--listen", f"127.0.0.1:{port}", "--bootstrap-server", cluster,
               "--state-topic", f"__bench_relay_{uuid.uuid4().hex[:6]}", "--event-topic", "",
               "--config", "offsets.topic.num.partitions=1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    line = process.stdout.readline()  # type: ignore[union-attr]
    if not line.startswith("coordinator listening"):
        process.kill()
        raise RuntimeError(f"coordinator did not start: {line!r}\n{log.read_text()[-3000:]}")
    return process


def run(args: argparse.Namespace, cluster: str) -> dict:
    topic = f"bench-relay-{uuid.uuid4().hex[:6]}"
    progress(f"filling {topic} with {args.megabytes} MB of {RECORD_BYTES}-byte records (direct) ...")
    records = fill(cluster, topic, args.megabytes)
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="bench-relay-", suffix=".log")[1])
    coordinator = start_coordinator(cluster, port, log)
    relay = f"127.0.0.1:{port}"
    try:
        read_all(relay, topic, min(records, 1_000))  # warm-up: connections, metadata, listeners
        paths = {"direct": cluster, "relay": relay}
        reads: dict[str, list[tuple[float, int]]] = {"direct": [], "relay": []}
        relay_cpu: list[float] = []
        for repeat in range(args.repeats):
            for name, bootstrap in paths.items():
                cpu_before = cpu_seconds(coordinator.pid)
                seconds, size = read_all(bootstrap, topic, records)
                if name == "relay":
                    relay_cpu.append(cpu_seconds(coordinator.pid) - cpu_before)
                reads[name].append((seconds, size))
                progress(f"  fetch {repeat + 1}/{args.repeats} {name:6s}: {size / seconds / 1e6:7.1f} MB/s "
                         f"{records / seconds:9.0f} records/s")

        producers = {name: Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                     "linger.ms": 0, "socket.nagle.disable": True})
                     for name, bootstrap in paths.items()}
        latencies: dict[str, list[float]] = {"direct": [], "relay": []}
        for name, producer in producers.items():
            round_trips(producer, topic, 50)  # warm-up: producer id, connections
        blocks = max(1, args.round_trips // BLOCK)
        for _ in range(blocks):
            for name, producer in producers.items():
                latencies[name] += round_trips(producer, topic, BLOCK)
        for name in paths:
            progress(f"  produce {name:6s}: p50 {percentile(latencies[name], 0.5):.3f} ms "
                     f"p99 {percentile(latencies[name], 0.99):.3f} ms")
    finally:
        coordinator.terminate()
        coordinator.wait(30)

    def fetch_figures(name: str) -> dict:
        mb_s = statistics.median(size / seconds / 1e6 for seconds, size in reads[name])
        records_s = statistics.median(records / seconds for seconds, _size in reads[name])
        return {"mb_s": round(mb_s, 1), "records_s": round(records_s)}

    direct, relayed = fetch_figures("direct"), fetch_figures("relay")
    relayed_mb = statistics.median(size for _s, size in reads["relay"]) / 1e6
    p99 = {name: percentile(values, 0.99) for name, values in latencies.items()}
    p50 = {name: percentile(values, 0.5) for name, values in latencies.items()}
    ratio = relayed["mb_s"] / direct["mb_s"]
    added_p99 = p99["relay"] - p99["direct"]
    return {
        "bench": "relay", "megabytes": args.megabytes, "records": records, "repeats": args.repeats,
        "fetch_direct": direct, "fetch_relay": relayed, "fetch_ratio": round(ratio, 3),
        "relay_cpu_ms_per_mb": round(statistics.median(relay_cpu) * 1000 / relayed_mb, 3),
        "produce_round_trips": len(latencies["relay"]),
        "produce_p50_ms": {k: round(v, 3) for k, v in p50.items()},
        "produce_p99_ms": {k: round(v, 3) for k, v in p99.items()},
        "produce_added_p99_ms": round(added_p99, 3),
        "target_fetch_ratio_met": ratio >= 0.8, "target_added_p99_met": added_p99 <= 1.0,
    }




def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--round-trips", type=int, default=2_000)
    parser.add_argument("--quick", action="store_true", help="50 MB, 2 repeats, 600 round trips")
    args = parser.parse_args()
    if args.quick:
        args.megabytes, args.repeats, args.round_trips = 50, 2, 600
    with bench_kafka_blocking() as bootstrap:
        result = run(args, bootstrap)
    print(f"fetch: direct {result['fetch_direct']['mb_s']} MB/s, relay {result['fetch_relay']['mb_s']} MB/s, "
          f"ratio {result['fetch_ratio']} (target >= 0.8); relay CPU {result['relay_cpu_ms_per_mb']} ms/MB")
    print(f"produce p99: direct {result['produce_p99_ms']['direct']} ms, relay {result['produce_p99_ms']['relay']} "
          f"ms, added {result['produce_added_p99_ms']} ms (target <= 1 ms)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
