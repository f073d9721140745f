"""Storage benchmark against a real Apache Kafka broker (the embedded one unless KAFKA_BOOTSTRAP is set).

  python -m bench.storage [--groups 100000] [--members 5] [--commit-groups 1000] [--commit-seconds 10] [--quick]

(a) Load: writes --groups group records of --members members each (realistic sizes: consumer-protocol
    subscription and assignment bytes, UUID member ids) to a fresh 50-partition state topic, then a fresh
    store and coordinator load them: `read_s` = reading + decoding + replaying the topic (worker thread),
    `materialize_s` = handing the records to a GroupRuntime which builds the groups and arms a session
    deadline per member, `total_s` = both. Target: total ≤ 30 s for 100,000 groups × 5 members.
(b) OffsetCommit throughput: --commit-groups simple consumers (generation -1) each commit 5 partitions in a
    loop through GroupRuntime.commit_offsets for --commit-seconds; each commit waits for acks=all.
    Reports commits/s, partitions/s and latency percentiles, after a 3 s warm-up that is not counted.
(c) What transactions cost: the same commit loop through the idempotent producer and through the transactional
    one (coordinator/storage/transactions.py, group commit), with one committer (each write pays its own round
    trip: the cost a SyncGroup's group record pays) and with --commit-groups committers (writes share
    transactions). `transactional_vs_idempotent` holds the latency and throughput ratios.
The last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import struct
import sys
import time
import uuid

from bench.kafka import bench_kafka
from coordinator.config import CoordinatorConfig
from coordinator.group.api import OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic
from coordinator.group.runtime import GroupRuntime
from coordinator.group.status import ShardStatus
from protocol.error_codes import Errors
from coordinator.group.records import GroupMetadataRecord, GroupRecord, MemberRecord
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore
from coordinator.timer import MonotonicClock, SystemTimer

WRITE_WINDOW = 5_000  # group writes in flight at once while filling the topic
WARMUP_S = 3.0  # commits before the measured window (not counted)


def subscription(topics: list[str]) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    return out + struct.pack(">i", -1)


def assignment(topic: str, partitions: list[int]) -> bytes:
    out = struct.pack(">hi", 0, 1) + struct.pack(">h", len(topic)) + topic.encode()
    out += struct.pack(">i", len(partitions)) + b"".join(struct.pack(">i", p) for p in partitions)
    return out + struct.pack(">i", -1)


def group_record(index: int, members: int) -> GroupRecord:
    sub = subscription(["orders", "payments"])
    member_records = [
        MemberRecord(member_id=f"consumer-{index}-{m}-{uuid.uuid4()}", group_instance_id=None,
                     client_id=f"consumer-{index}-{m}", client_host="/10.0.0.1", rebalance_timeout_ms=300_000,
                     session_timeout_ms=45_000, subscription=sub, assignment=assignment("orders", [m, m + members]))
        for m in range(members)]
    return GroupRecord("consumer", 7, "range", member_records[0].member_id, 1_700_000_000_000, member_records)


async def fill_topic(store: KafkaGroupStore, groups: int, members: int) -> float:
    started = time.perf_counter()
    for first in range(0, groups, WRITE_WINDOW):
        window = range(first, min(first + WRITE_WINDOW, groups))
        await asyncio.gather(*(store.store_group(f"bench-group-{i}", group_record(i, members)) for i in window))
    return time.perf_counter() - started


def make_store(bootstrap: str, topic: str, transactional: bool = False) -> KafkaGroupStore:
    return KafkaGroupStore(StorageConfig(bootstrap=bootstrap, state_topic=topic, event_topic=None,
                                         transactional_id=f"{topic}-writer" if transactional else None),
                           load_timeout_ms=600_000)


async def bench_load(bootstrap: str, groups: int, members: int) -> dict:
    topic = f"__bench-state-{uuid.uuid4().hex[:8]}"
    writer = make_store(bootstrap, topic)
    await writer.start()
    try:
        write_s = await fill_topic(writer, groups, members)
    finally:
        await writer.close()

    reader = make_store(bootstrap, topic)
    await reader.start()
    timer = SystemTimer("bench", clock=MonotonicClock())
    coordinator = GroupRuntime(CoordinatorConfig(), timer, reader)
    try:
        started = time.perf_counter()
        state = await reader.read()
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        coordinator.begin_loading()
        for group_id, value in state.groups.items():  # what GroupRuntime.load does after the read, in one go
            coordinator.shard_for(group_id).load_group(group_id, [GroupMetadataRecord(group_id, value)])
        for shard in coordinator.shards:
            shard.status = ShardStatus.ACTIVE
        materialize_s = time.perf_counter() - started
        loaded = len(coordinator.groups)
        loaded_members = sum(len(g.members) for g in coordinator.groups.values())
    finally:
        await coordinator.shutdown()
        await timer.close()
        await reader.close()
    assert loaded == groups and loaded_members == groups * members, (loaded, loaded_members)
    total_s = read_s + materialize_s
    print(f"load: {groups} groups x {members} members ({state.records} records) written in {write_s:.1f}s; "
          f"read {read_s:.2f}s + materialize {materialize_s:.2f}s = {total_s:.2f}s", file=sys.stderr)
    return {"groups": groups, "members_per_group": members, "records": state.records,
            "write_s": round(write_s, 2), "write_groups_per_s": round(groups / write_s),
            "read_s": round(read_s, 2), "materialize_s": round(materialize_s, 2), "total_s": round(total_s, 2),
            "target_s": 30, "meets_target": total_s <= 30}


async def bench_commits(bootstrap: str, groups: int, seconds: float, partitions: int,
                        transactional: bool = False) -> dict:
    store = make_store(bootstrap, f"__bench-state-{uuid.uuid4().hex[:8]}", transactional)
    await store.start()
    timer = SystemTimer("bench", clock=MonotonicClock())
    coordinator = GroupRuntime(CoordinatorConfig(), timer, store)
    latencies_ms: list[float] = []
    failures = 0
    measure_from = time.perf_counter() + WARMUP_S  # the broker's JIT and the producer id come first
    deadline = measure_from + seconds

    async def committer(index: int) -> None:
        nonlocal failures
        offset = 0
        while time.perf_counter() < deadline:
            offset += 1
            request = OffsetCommitRequest(f"bench-commit-{index}", -1, "", [OffsetCommitRequestTopic(
                "orders", [OffsetCommitRequestPartition(p, offset) for p in range(partitions)])])
            started = time.perf_counter()
            response = await coordinator.commit_offsets(request)
            if started >= measure_from:
                latencies_ms.append((time.perf_counter() - started) * 1000)
            if any(p.error_code != Errors.NONE for t in response.topics for p in t.partitions):
                failures += 1

    try:
        await asyncio.gather(*(committer(i) for i in range(groups)))
    finally:
        await coordinator.shutdown()
        await timer.close()
        await store.close()
    commits = len(latencies_ms)
    quantiles = statistics.quantiles(latencies_ms, n=100)
    result = {"producer": "transactional" if transactional else "idempotent",
              "groups": groups, "partitions_per_commit": partitions, "seconds": seconds, "commits": commits,
              "failures": failures, "commits_per_s": round(commits / seconds),
              "partitions_per_s": round(commits * partitions / seconds),
              "latency_ms_p50": round(quantiles[49], 2), "latency_ms_p99": round(quantiles[98], 2),
              "latency_ms_max": round(max(latencies_ms), 2)}
    print(f"commits ({result['producer']}): {result['commits_per_s']}/s ({result['partitions_per_s']} partitions/s) from {groups} "
          f"groups; p50 {result['latency_ms_p50']} ms, p99 {result['latency_ms_p99']} ms, "
          f"failures {failures}", file=sys.stderr)
    return result


async def main(args: argparse.Namespace) -> dict:
    async with bench_kafka(heap_mb=1024) as bootstrap:
        load = commits = None
        if not args.transactions_only:
            load = await bench_load(bootstrap, args.groups, args.members)
            gc.collect()  # free the loaded coordinator's 100k groups now, not in a pause inside the commit window
            commits = await bench_commits(bootstrap, args.commit_groups, args.commit_seconds,
                                          args.commit_partitions)
        costs = await transaction_costs(bootstrap, args)
    return {"bench": "storage", "kafka": "given" if os.environ.get("KAFKA_BOOTSTRAP") else "embedded",
            "load": load, "offset_commit": commits, "transactional_vs_idempotent": costs}


async def transaction_costs(bootstrap: str, args: argparse.Namespace) -> dict:
    """Sequential (1 committer) and concurrent (--commit-groups) commits, idempotent then transactional."""
    runs: dict[str, dict] = {}
    for label, groups in (("sequential", 1), ("concurrent", args.commit_groups)):
        for transactional in (False, True):
            mode = "transactional" if transactional else "idempotent"
            runs[f"{label}_{mode}"] = await bench_commits(bootstrap, groups, args.commit_seconds,
                                                          args.commit_partitions, transactional)
    ratios = {}
    for label in ("sequential", "concurrent"):
        plain, txn = runs[f"{label}_idempotent"], runs[f"{label}_transactional"]
        ratios[label] = {"p50_latency_ratio": round(txn["latency_ms_p50"] / plain["latency_ms_p50"], 2),
                         "p99_latency_ratio": round(txn["latency_ms_p99"] / plain["latency_ms_p99"], 2),
                         "throughput_ratio": round(txn["commits_per_s"] / max(plain["commits_per_s"], 1), 2)}
    print(f"transactional vs idempotent: {ratios}", file=sys.stderr)
    return {"runs": runs, "ratios": ratios}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--commit-groups", type=int, default=1_000)
    parser.add_argument("--commit-seconds", type=float, default=10.0)
    parser.add_argument("--commit-partitions", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="10,000 groups and 3 s of commits")
    parser.add_argument("--transactions-only", action="store_true",
                        help="only (c): transactional vs idempotent commits")
    args = parser.parse_args(argv)
    if args.quick:
        args.groups, args.commit_seconds = 10_000, 3.0
    return args


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse_args()))))
