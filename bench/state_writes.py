"""What a state write waits for on a real broker: K writers, each with one write in flight at a time (as K client
connections each with one request parked on its write), appending to one partition of a transactional
KafkaGroupStore (the server's default writer: group commit, one transaction in flight per producer).

  python -m bench.state_writes [--writers 1,10,100] [--seconds 4] [--repeats 2] [--linger-ms 5,0]
                               [--state-writer librdkafka,native]

Per run: writes and transactions in the window, ms per transaction, writes per transaction, a write's latency
(queued → acknowledged) p50/p90, the process's CPU per transaction, and how many AddPartitionsToTxn requests
Kafka's transaction coordinator answered CONCURRENT_TRANSACTIONS (it answers so while it still writes the commit
markers of the transaction before; librdkafka retries 20 ms later), counted from librdkafka's `eos` debug lines.
With several --linger-ms values the runs alternate between them (linger.ms of the state producer), and so they do
with several --state-writer values (StorageConfig.state_writer: librdkafka's transactional producer, or our own,
coordinator/storage/native_transactions.py, whose refusals are its own counts of CONCURRENT_TRANSACTIONS retried;
linger.ms does not apply to it).
The broker is the embedded one unless KAFKA_BOOTSTRAP is set. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

from bench.kafka import bench_kafka
from coordinator.group.records import GroupMetadataRecord
from coordinator.storage import state_producers
from coordinator.storage.native_transactions import NativeTransactionalProducer
from coordinator.storage.partition_writers import TransactionalWriters
from tests.support.kafka_store import stable_group, started_store, unique_topic

_settings_of = state_producers.producer_settings


class _Counts(logging.Handler):
    """librdkafka's eos debug lines: AddPartitionsToTxn sent, and answered CONCURRENT_TRANSACTIONS."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.concurrent = 0
        self.registering = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "concurrent operation" in text or "CONCURRENT_TRANSACTIONS" in text:
            self.concurrent += 1
        elif "Registering partitions" in text:
            self.registering += 1


def _native_counts(producer: TransactionalWriters) -> tuple[int, int]:
    """Our own writer's CONCURRENT_TRANSACTIONS retries and AddPartitionsToTxn requests so far."""
    natives = [p for p in producer.producers if isinstance(p, NativeTransactionalProducer)]
    return (sum(p.concurrent_transactions_retries for p in natives), sum(p.add_partitions_sent for p in natives))


async def one_run(bootstrap: str, writers: int, seconds: float, linger_ms: int,
                  state_writer: str = "librdkafka") -> dict[str, Any]:
    counts = _Counts()
    logger = logging.getLogger(f"bench.state_writes.librdkafka.{time.monotonic_ns()}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(counts)

    def settings(config: Any) -> dict[str, Any]:
        return {**_settings_of(config), "linger.ms": linger_ms, "debug": "eos", "logger": logger}

    state_producers.producer_settings = settings
    topic = unique_topic()
    try:
        store = await started_store(bootstrap, topic, partitions=1, transactional_id=f"{topic}-writer",
                                    commit_timeout_ms=30_000, state_writer=state_writer)
    finally:
        state_producers.producer_settings = _settings_of
    latencies: list[float] = []

    async def writer(index: int, until: float) -> None:
        records = [GroupMetadataRecord(f"g{index}", stable_group(generation=1, size=1))]
        while time.perf_counter() < until:
            sent = time.perf_counter()
            await store.append(0, records)
            latencies.append((time.perf_counter() - sent) * 1000)

    try:
        producer = store._producer
        assert isinstance(producer, TransactionalWriters)
        await asyncio.gather(*(writer(i, time.perf_counter() + 1.0) for i in range(writers)))  # warm-up
        latencies.clear()
        counts.concurrent = counts.registering = 0
        native_before = _native_counts(producer)
        transactions, cpu, started = producer.transactions, time.process_time(), time.perf_counter()
        await asyncio.gather(*(writer(i, started + seconds) for i in range(writers)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        transactions = producer.transactions - transactions
        native_after = _native_counts(producer)
        counts.concurrent += native_after[0] - native_before[0]
        counts.registering += native_after[1] - native_before[1]
    finally:
        await store.close()
    latencies.sort()
    done = max(transactions, 1)
    return {"state_writer": state_writer, "writers": writers, "linger_ms": linger_ms, "writes": len(latencies), "transactions": transactions,
            "ms_per_transaction": round(elapsed * 1000 / done, 2),
            "writes_per_transaction": round(len(latencies) / done, 1),
            "write_ms_p50": round(latencies[len(latencies) // 2], 2),
            "write_ms_p90": round(latencies[int(len(latencies) * 0.9)], 2),
            "cpu_ms_per_transaction": round(cpu * 1000 / done, 2),
            "concurrent_transactions_per_transaction": round(counts.concurrent / done, 3),
            "add_partitions_sent_per_transaction": round(counts.registering / done, 3),
            "load_average_1m": round(os.getloadavg()[0], 1)}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    async with bench_kafka() as bootstrap:
        for writers in args.writers:
            for _ in range(args.repeats):
                for linger_ms in args.linger_ms:
                    for state_writer in args.state_writer:
                        run = await one_run(bootstrap, writers, args.seconds, linger_ms, state_writer)
                        print(json.dumps(run), file=sys.stderr, flush=True)
                        runs.append(run)
    return {"bench": "state_writes", "runs": runs}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    numbers = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--writers", type=numbers, default=[1, 10, 100])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--linger-ms", type=numbers, default=[5])
    parser.add_argument("--state-writer", type=lambda s: s.split(","), default=["librdkafka"],
                        help="comma-separated writers to alternate: librdkafka, native")
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse_args()))))
