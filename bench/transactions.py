"""Exactly-once throughput: transactions per second of a consume-transform-produce loop through the coordinator
(relay on) against the same loop straight to Kafka, same run, same broker.

  python -m bench.transactions [--transactions 300] [--per-transaction 10] [--repeats 3] [--warmup 20]
                               [--retry-backoff-ms N] [--baseline-tree DIR] [--warm-runs 1]

The loop is what an exactly-once application does (tests/support/eos_loop.py, without the abort): a
confluent-kafka read_committed consumer assigned one input partition, a transactional producer; per transaction
it takes --per-transaction records, produces one output record each, sends the consumer's position with
`send_offsets_to_transaction` and commits. Each measured run gets a fresh input topic, output topic, group and
transactional id; its first --warmup transactions (coordinator discovery, the first AddPartitionsToTxn) are not
measured. Runs alternate (ours, Kafka, Kafka, ours, ...); the medians and their ratio are reported (target: ours
>= 0.8x Kafka's), with the CPU time per transaction of our server and of the broker (from /proc, all threads;
through us the broker still does the transaction coordinator's and the partitions' work).
`--baseline-tree DIR` races a second build of ours (a source tree, e.g. /work/main, run with PYTHONPATH=DIR) as
'before' in the same runs, on the same broker, the three paths rotating (ours, before, Kafka; before, Kafka, ours;
...), and reports ours ÷ before as well.
Everything shares the machine: quote the ratio and the CPU per transaction, with the load average (printed).
Progress goes to stderr; the last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.relay import cpu_seconds, progress, start_coordinator
from coordinator.embedded import EmbeddedKafka, kafka_version
from coordinator.embedded.ports import free_port


def create_topics(bootstrap: str, *topics: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1) for topic in topics]).values():
        future.result(60)


def fill(bootstrap: str, topic: str, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for index in range(records):
        producer.produce(topic, value=str(index).encode(), partition=0)
        if index % 1_000 == 0:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("the input was not all written")


def until_group_coordinator(bootstrap: str, timeout_s: float = 120) -> None:
    """Until `bootstrap`'s group coordinator answers OffsetFetch (a fresh broker answers NOT_COORDINATOR while it
    creates __consumer_offsets, and librdkafka drops an assigned partition whose committed offset failed)."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-txn-probe-{uuid.uuid4().hex[:6]}"})
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                probe.committed([TopicPartition("bench-txn-probe", 0)], timeout=10)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)  # a retry interval: the broker gives no event to wait on
    finally:
        probe.close()


def take(consumer: Consumer, count: int, timeout_s: float = 60) -> list[Any]:
    taken: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(taken) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(taken)} of {count} input records consumed in {timeout_s} s")
        for message in consumer.consume(count - len(taken), 0.5):
            if message.error() is None:
                taken.append(message)
    return taken


def loop_run(bootstrap: str, cluster: str, args: argparse.Namespace, pids: dict[str, int]) -> dict[str, float]:
    """One run of the loop with `bootstrap` as the clients' bootstrap (us or Kafka); figures of the measured part."""
    source, sink = f"bench-txn-in-{uuid.uuid4().hex[:6]}", f"bench-txn-out-{uuid.uuid4().hex[:6]}"
    create_topics(cluster, source, sink)
    fill(cluster, source, (args.warmup + args.transactions) * args.per_transaction)
    group = f"bench-txn-{uuid.uuid4().hex[:6]}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-txn-{uuid.uuid4().hex[:6]}",
                         "linger.ms": 0, **({"retry.backoff.ms": args.retry_backoff_ms}
                                            if args.retry_backoff_ms is not None else {})})
    try:
        producer.init_transactions(60)
        consumer.assign([TopicPartition(source, 0)])
        metadata = consumer.consumer_group_metadata()
        started = loop_cpu_before = 0.0
        cpu_before: dict[str, float] = {}
        phases: dict[str, list[float]] = {"take_produce": [], "send_offsets": [], "commit": []}
        for transaction in range(args.warmup + args.transactions):
            if transaction == args.warmup:
                cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                started, loop_cpu_before = time.perf_counter(), time.process_time()
            t0 = time.perf_counter()
            batch = take(consumer, args.per_transaction)
            producer.begin_transaction()
            for message in batch:
                producer.produce(sink, value=b"out-" + message.value(), partition=0)
            t1 = time.perf_counter()
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()), metadata, 60)
            t2 = time.perf_counter()
            producer.commit_transaction(60)
            if transaction >= args.warmup:
                phases["take_produce"].append(t1 - t0)
                phases["send_offsets"].append(t2 - t1)
                phases["commit"].append(time.perf_counter() - t2)
        elapsed = time.perf_counter() - started
        loop_cpu = time.process_time() - loop_cpu_before
        cpu_used = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
    finally:
        consumer.close()
    [committed] = consumer_offset(bootstrap, group, source)
    expected = (args.warmup + args.transactions) * args.per_transaction
    if committed != expected:
        raise RuntimeError(f"the group's committed offset is {committed}, not {expected}")
    figures = {"transactions_per_s": round(args.transactions / elapsed, 1),
               "ms_per_transaction": round(elapsed / args.transactions * 1000, 2),
               "loop_cpu_share": round(loop_cpu / elapsed, 2)}
    for name, used in cpu_used.items():
        figures[f"{name}_cpu_ms_per_transaction"] = round(used / args.transactions * 1000, 3)
    for phase, times in phases.items():  # where a slow run's time goes: a phase's tail, or all of it
        times.sort()
        figures[f"{phase}_ms_p50"] = round(times[len(times) // 2] * 1000, 2)
        figures[f"{phase}_ms_p90"] = round(times[int(len(times) * 0.9)] * 1000, 2)
        figures[f"{phase}_ms_max"] = round(times[-1] * 1000, 2)
        figures[f"{phase}_ms_mean"] = round(sum(times) / len(times) * 1000, 2)
    return figures


def consumer_offset(bootstrap: str, group: str, topic: str) -> list[int]:
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                       "isolation.level": "read_committed"})
    try:
        return [tp.offset for tp in reader.committed([TopicPartition(topic, 0)], timeout=60)]
    finally:
        reader.close()


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {name: round(statistics.median(run[name] for run in runs), 3) for name in runs[0]}


def start_tree(cluster: str, port: int, log: Path, tree: str) -> subprocess.Popen:
    """`coordinator serve` of the source tree `tree` (its package first on the path), as start_coordinator's."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(Path(tree).resolve())
    try:
        return start_coordinator(cluster, port, log)
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def run(args: argparse.Namespace, cluster: str, broker_pid: int | None) -> dict[str, Any]:
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    logs: dict[str, str] = {}
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "kafka": []}
    try:
        for name in ("ours", "before") if args.baseline_tree else ("ours",):
            port = free_port()
            log = Path(tempfile.mkstemp(prefix=f"bench-transactions-{name}-", suffix=".log")[1])
            process = (start_coordinator(cluster, port, log) if name == "ours"
                       else start_tree(cluster, port, log, args.baseline_tree))
            servers[name], logs[name] = (process, f"127.0.0.1:{port}"), str(log)
            runs[name] = []
        until_group_coordinator(cluster)
        for _, address in servers.values():
            until_group_coordinator(address)
        order = list(servers) + ["kafka"]
        # the broker's JIT warms up over the first thousand transactions: the first runs of a fresh broker are up
        # to 4x slower whichever path they take, so one unmeasured run per path comes first
        for warm in range(args.warm_runs):
            for path in order:
                figures = loop_run(servers[path][1] if path in servers else cluster, cluster, args,
                                   {"coordinator": servers[path if path in servers else "ours"][0].pid})
                progress(f"warm-up run {warm + 1} {path} (not counted): {json.dumps(figures)}")
        for repeat in range(args.repeats):
            turn = order[repeat % len(order):] + order[:repeat % len(order)]
            for path in turn:
                # CPU of the coordinator serving this run (the other one idles), and of the broker
                pids = {**({"coordinator": servers[path][0].pid} if path in servers
                           else {"coordinator": servers["ours"][0].pid}),
                        **({"broker": broker_pid} if broker_pid else {})}
                figures = loop_run(servers[path][1] if path in servers else cluster, cluster, args, pids)
                runs[path].append(figures)
                progress(f"repeat {repeat + 1} {path}: {json.dumps(figures)}")
    finally:
        for process, _ in servers.values():
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
    medians = {path: median_of(figures) for path, figures in runs.items()}
    load = os.getloadavg()
    return {"bench": "transactions", "kafka_version": kafka_version(), "repeats": args.repeats,
            "transactions": args.transactions, "per_transaction": args.per_transaction,
            "retry_backoff_ms": args.retry_backoff_ms, "warm_runs": args.warm_runs,
            "load_average_1m": round(load[0], 1), "cpus": os.cpu_count(),
            "ours": medians["ours"], "kafka": medians["kafka"],
            "ratio": round(medians["ours"]["transactions_per_s"] / medians["kafka"]["transactions_per_s"], 3),
            **({"before": medians["before"], "baseline_tree": args.baseline_tree,
                "before_ratio": round(medians["before"]["transactions_per_s"]
                                      / medians["kafka"]["transactions_per_s"], 3),
                "ours_over_before": round(medians["ours"]["transactions_per_s"]
                                          / medians["before"]["transactions_per_s"], 3)}
               if "before" in medians else {}),
            "coordinator_logs": logs, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=300, help="measured transactions per run")
    parser.add_argument("--per-transaction", type=int, default=10, help="input records per transaction")
    parser.add_argument("--repeats", type=int, default=3, help="runs per path (alternating)")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured transactions at the start of a run")
    parser.add_argument("--retry-backoff-ms", type=int,
                        help="the producer's retry.backoff.ms (librdkafka's default, 100, when not given): the pause "
                             "after CONCURRENT_TRANSACTIONS, which sets the loop's cadence")
    parser.add_argument("--warm-runs", type=int, default=1,
                        help="unmeasured runs per path before the measured ones (the broker's JIT warm-up)")
    parser.add_argument("--baseline-tree", help="a source tree of ours to race as 'before' (see above)")
    args = parser.parse_args()
    given = os.environ.get("KAFKA_BOOTSTRAP")
    broker = None
    if given is None:
        progress("starting the embedded Apache Kafka broker ...")
        broker = EmbeddedKafka()
        broker.start_blocking()
    try:
        result = run(args, given or broker.bootstrap, broker.pid if broker else None)  # type: ignore[union-attr]
    finally:
        if broker is not None:
            broker.stop_blocking()
            broker.remove_data()
    ours, kafka = result["ours"], result["kafka"]
    print(f"transactions/s (median of {args.repeats}): through us {ours['transactions_per_s']}, straight to Kafka "
          f"{kafka['transactions_per_s']}, ratio {result['ratio']} (target >= 0.8); our CPU "
          f"{ours['coordinator_cpu_ms_per_transaction']} ms per transaction; load average "
          f"{result['load_average_1m']} on {result['cpus']} CPUs")
    if "before" in result:
        print(f"before ({args.baseline_tree}): {result['before']['transactions_per_s']}/s, ratio "
              f"{result['before_ratio']}; ours / before {result['ours_over_before']}; its CPU "
              f"{result['before']['coordinator_cpu_ms_per_transaction']} ms per transaction")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
