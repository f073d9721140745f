"""Where a transaction's time goes: the exactly-once loop of bench/transactions.py, once through us and once straight
to Kafka, with librdkafka's `debug=eos,protocol` log of the producer parsed into round trips per API.

  python -m bench.txn_trace [--transactions 60] [--retry-backoff-ms 5] [--baseline-tree DIR] 2>/dev/null

Per path: the median wall time of each phase of a transaction (take, produce, send_offsets_to_transaction,
commit_transaction), and per request type the requests per transaction and their median round trip as the
client measured it (librdkafka's rtt). The producer's log goes to a file per path (printed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.relay import progress, start_coordinator
from bench.transactions import create_topics, fill, start_tree, take, until_group_coordinator
from coordinator.embedded import EmbeddedKafka
from coordinator.embedded.ports import free_port

_RECEIVED = re.compile(r"Received (\w+)Response \(v\d+, \d+ bytes, CorrId \d+, rtt ([\d.]+)ms\)")


def loop(bootstrap: str, cluster: str, args: argparse.Namespace) -> dict[str, Any]:
    source, sink = f"trace-in-{uuid.uuid4().hex[:6]}", f"trace-out-{uuid.uuid4().hex[:6]}"
    create_topics(cluster, source, sink)
    fill(cluster, source, (args.warmup + args.transactions) * args.per_transaction)
    group = f"trace-{uuid.uuid4().hex[:6]}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    phases: dict[str, list[float]] = defaultdict(list)
    # librdkafka's own stderr log (timestamps to the ms): this process's stderr is the file
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"trace-{uuid.uuid4().hex[:6]}",
                         "linger.ms": 0, "retry.backoff.ms": args.retry_backoff_ms, "debug": "eos,protocol"})
    marker = "TRACE-MEASURED-START"
    try:
        producer.init_transactions(60)
        consumer.assign([TopicPartition(source, 0)])
        metadata = consumer.consumer_group_metadata()
        for transaction in range(args.warmup + args.transactions):
            if transaction == args.warmup:
                print(f"%7|{time.time():.3f}|{marker}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            batch = take(consumer, args.per_transaction)
            t1 = time.perf_counter()
            producer.begin_transaction()
            for message in batch:
                producer.produce(sink, value=b"out-" + message.value(), partition=0)
            t2 = time.perf_counter()
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()), metadata, 60)
            t3 = time.perf_counter()
            producer.commit_transaction(60)
            t4 = time.perf_counter()
            if transaction >= args.warmup:
                for name, value in (("take", t1 - t0), ("produce", t2 - t1), ("send_offsets", t3 - t2),
                                    ("commit", t4 - t3), ("total", t4 - t0)):
                    phases[name].append(value * 1000)
        print(f"%7|{time.time():.3f}|TRACE-MEASURED-END", file=sys.stderr, flush=True)
    finally:
        consumer.close()
        del producer
    return {name: round(statistics.median(values), 2) for name, values in phases.items()}


def parse(log: Path, transactions: int) -> dict[str, Any]:
    rtts: dict[str, list[float]] = defaultdict(list)
    measuring = False
    for line in log.read_text(errors="replace").splitlines():
        if "TRACE-MEASURED-START" in line:
            measuring = True
        elif "TRACE-MEASURED-END" in line:
            measuring = False
        elif measuring and (match := _RECEIVED.search(line)):
            rtts[match.group(1)].append(float(match.group(2)))
        elif measuring and "AddOffsetsToTxn response from" in line and rtts["AddOffsetsToTxn"]:
            # the answered one apart: a retried one (CONCURRENT_TRANSACTIONS) only forwards
            rtts["AddOffsetsToTxn." + ("ok" if "NO_ERROR" in line else "retried")].append(rtts["AddOffsetsToTxn"][-1])
    return {api: {"per_transaction": round(len(values) / transactions, 2),
                  "median_rtt_ms": round(statistics.median(values), 2),
                  "total_ms_per_transaction": round(sum(values) / transactions, 2)}
            for api, values in sorted(rtts.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=60)
    parser.add_argument("--per-transaction", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--retry-backoff-ms", type=int, default=5)
    parser.add_argument("--baseline-tree", help="a source tree of ours traced as 'before' too")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--path", choices=("ours", "before", "kafka"), help="(internal) run one path with stderr as its log")
    parser.add_argument("--cluster", help="(internal)")
    parser.add_argument("--bootstrap", help="(internal)")
    args = parser.parse_args()
    if args.path is not None:
        print(json.dumps(loop(args.bootstrap, args.cluster, args)))
        return
    broker = EmbeddedKafka()
    broker.start_blocking()
    port = free_port()
    coordinator_log = Path(tempfile.mkstemp(prefix="txn-trace-coordinator-", suffix=".log")[1])
    coordinator = start_coordinator(broker.bootstrap, port, coordinator_log)
    servers = [coordinator]
    result: dict[str, Any] = {"load_average_1m": round(os.getloadavg()[0], 2)}
    try:
        paths = {"ours": f"127.0.0.1:{port}"}
        if args.baseline_tree:
            before_port = free_port()
            servers.append(start_tree(broker.bootstrap, before_port, coordinator_log.with_suffix(".before.log"),
                                      args.baseline_tree))
            paths["before"] = f"127.0.0.1:{before_port}"
        paths["kafka"] = broker.bootstrap
        until_group_coordinator(broker.bootstrap)
        for address in paths.values():
            until_group_coordinator(address)
        # one unmeasured run per path first (a fresh broker's JIT: its first runs are the slowest, whichever path),
        # then the paths rotate, so no path is always the one after the broker's idle moment
        order = list(paths.items())
        plan = [(path, bootstrap, False) for path, bootstrap in order]
        for repeat in range(args.repeats):
            turn = order[repeat % len(order):] + order[:repeat % len(order)]
            plan += [(path, bootstrap, True) for path, bootstrap in turn]
        for path, bootstrap, measured in plan:
            log = Path(tempfile.mkstemp(prefix=f"txn-trace-{path}-", suffix=".log")[1])
            with log.open("w") as stderr:
                done = subprocess.run([sys.executable, "-m", "bench.txn_trace", "--path", path, "--cluster",
                                       broker.bootstrap, "--bootstrap", bootstrap,
                                       "--transactions", str(args.transactions), "--warmup", str(args.warmup),
                                       "--per-transaction", str(args.per_transaction),
                                       "--retry-backoff-ms", str(args.retry_backoff_ms)],
                                      stdout=subprocess.PIPE, stderr=stderr, text=True, check=True)
            figures = {"phases_ms": json.loads(done.stdout.strip().splitlines()[-1]),
                       "round_trips": parse(log, args.transactions), "log": str(log)}
            if measured:
                result.setdefault(path, []).append(figures)
            progress(f"{path}{'' if measured else ' (warm-up, not counted)'}: {json.dumps(figures)}")
    finally:
        for server in servers:
            server.terminate()
            server.wait(30)
        broker.stop_blocking()
        broker.remove_data()
    result["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    for path in paths:
        runs = result[path]
        apis = sorted({api for run in runs for api in run["round_trips"]})
        summary = {"phases_ms": {name: round(statistics.median(run["phases_ms"][name] for run in runs), 2)
                                 for name in runs[0]["phases_ms"]},
                   "round_trips": {api: {key: round(statistics.median(run["round_trips"].get(api, {}).get(key, 0.0)
                                                                      for run in runs), 2)
                                         for key in ("per_transaction", "median_rtt_ms", "total_ms_per_transaction")}
                                   for api in apis}}
        result[f"{path}_median"] = summary
        print(f"{path}: {json.dumps(summary)}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
