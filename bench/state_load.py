"""The state-topic load through the raw Fetch reader (read_uncommitted, our own transaction tracking) against
librdkafka's read_committed read it replaces, on the same partitions (the embedded broker unless KAFKA_BOOTSTRAP).

  python -m bench.state_load [--records 300000] [--partitions 4] [--rounds 3]

Writes --records offset-commit records (idempotent producer, default batching) over --partitions partitions, then
loads them --rounds times each way, alternating. Reports per way the best wall time and the process CPU time per
record (both the reading thread's and librdkafka's threads), and the ratios raw/librdkafka. The last line of
output is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.kafka import bench_kafka
from coordinator.group.records import OffsetRecord
from coordinator.storage.loader import _read_committed, consumer_settings, read_state_with_transactions
from coordinator.storage.records import OffsetCommitKey, encode_key, encode_offset_commit_value
from coordinator.timer.clock import MonotonicClock


def fill(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(records):
        key = encode_key(OffsetCommitKey(f"group-{i % 5000}", "orders", i % 64))
        value = encode_offset_commit_value(OffsetRecord(i, commit_timestamp_ms=i))
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=i % partitions)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
    assert producer.flush(120) == 0


def timed(load: object) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    records = load()  # type: ignore[operator]
    return time.perf_counter() - wall, time.process_time() - cpu, records


async def main(args: argparse.Namespace) -> dict[str, object]:
    async with bench_kafka() as bootstrap:
        topic = f"bench-load-{uuid.uuid4().hex[:8]}"
        await asyncio.to_thread(fill, bootstrap, topic, args.records, args.partitions)
        settings = consumer_settings(bootstrap, "bench", 1 << 20)
        partitions = list(range(args.partitions))
        clock = MonotonicClock()

        def raw() -> int:
            state, _load = read_state_with_transactions(settings, topic, partitions, clock, 600_000)
            return state.records

        def librdkafka() -> int:
            return _read_committed(settings, topic, partitions, clock, 600_000, threading.Event(), None).records

        runs: dict[str, list[tuple[float, float, int]]] = {"raw_fetch": [], "librdkafka": []}
        for _ in range(args.rounds):
            for name, load in (("raw_fetch", raw), ("librdkafka", librdkafka)):
                runs[name].append(await asyncio.to_thread(timed, load))
        result: dict[str, object] = {}
        for name, measured in runs.items():
            assert all(r == args.records for _w, _c, r in measured), measured
            result[name] = {"best_wall_s": round(min(w for w, _c, _r in measured), 3),
                            "cpu_us_per_record": round(1e6 * min(c for _w, c, _r in measured) / args.records, 2)}
        raw_r, lib_r = result["raw_fetch"], result["librdkafka"]
        result["wall_ratio_raw_over_librdkafka"] = round(raw_r["best_wall_s"] / lib_r["best_wall_s"], 2)  # type: ignore[index]
        result["cpu_ratio_raw_over_librdkafka"] = round(
            raw_r["cpu_us_per_record"] / lib_r["cpu_us_per_record"], 2)  # type: ignore[index]
        return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
