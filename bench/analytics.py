"""Analytics benchmark: the batch job of `coordinator analyze` over synthetic events in a real Kafka topic
(the embedded broker unless KAFKA_BOOTSTRAP is set), Spark in local mode.

  python -m bench.analytics [--events 1000000] [--groups 200] [--master local[*]] [--quick]

Writes --events synthetic events (analytics/synthetic.py: realistic rebalance histories, keyed by group) straight
to a fresh 10-partition topic, then measures, in one process:
  startup_s   building the SparkSession (JVM start, connector jars) — paid once per `coordinator analyze`;
  scan_s      the baseline, side by side: Spark's Kafka source reading and counting the same records, no parsing
              (after one untimed warm-up scan);
  job_s       the whole batch job (parse, validate, every table written as Parquet, the report);
and reports events/s of the job, the job/scan ratio (what the analytics cost on top of reading the topic), the
share of a cold `coordinator analyze` that is Spark start-up, and the JVM's CPU time per event.
The last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from analytics import synthetic
from analytics.events import Source, read_batch
from analytics.job import run_batch
from analytics.session import build_session


def _jvm_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=10, replication_factor=1)])[topic].result(60)


def run(bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    topic = f"__bench_events_{os.getpid()}_{int(time.time())}"
    _create_topic(bootstrap, topic)
    print(f"writing {args.events:,} synthetic events for {args.groups} groups to {topic}", file=sys.stderr)
    started = time.monotonic()
    written = synthetic.write(bootstrap, topic, synthetic.history(args.events, args.groups))
    write_s = time.monotonic() - started

    started = time.monotonic()
    spark = build_session(args.master)
    startup_s = time.monotonic() - started
    jvm = spark.sparkContext._jvm.ProcessHandle.current().pid()  # type: ignore[union-attr]
    source = Source(bootstrap, topic)
    try:
        read_batch(spark, source).count()  # warm-up, not counted: the first query of a JVM pays for its JIT
        cpu0, started = _jvm_cpu_s(jvm), time.monotonic()
        scanned = read_batch(spark, source).count()
        scan_s, scan_cpu_s = time.monotonic() - started, _jvm_cpu_s(jvm) - cpu0
        print(f"baseline scan: {scanned:,} records in {scan_s:.1f}s", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="bench-analytics-") as out:
            cpu0, started = _jvm_cpu_s(jvm), time.monotonic()
            result = run_batch(spark, source, Path(out), progress=lambda m: print(f"  {m}", file=sys.stderr))
            job_s, job_cpu_s = time.monotonic() - started, _jvm_cpu_s(jvm) - cpu0
    finally:
        spark.stop()
    assert scanned == written and result.events == written, (scanned, written, result.events)
    return {
        "events": written, "groups": args.groups, "master": args.master or "local[*]", "cores": os.cpu_count(),
        "write_s": round(write_s, 2), "startup_s": round(startup_s, 2), "scan_s": round(scan_s, 2),
        "job_s": round(job_s, 2), "job_events_per_s": round(written / job_s),
        "cold_run_s": round(startup_s + job_s, 2), "startup_share": round(startup_s / (startup_s + job_s), 3),
        "job_over_scan": round(job_s / scan_s, 2),
        "jvm_cpu_us_per_event": round(job_cpu_s * 1e6 / written, 2),
        "scan_jvm_cpu_us_per_event": round(scan_cpu_s * 1e6 / written, 2),
        "phases_s": {name: round(seconds, 2) for name, seconds in result.seconds.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    parser.add_argument("--quick", action="store_true", help="20,000 events: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.events = 20_000
    from bench.kafka import bench_kafka_blocking

    with bench_kafka_blocking() as bootstrap:
        figures = run(bootstrap, args)
    print(f"job: {figures['events']:,} events in {figures['job_s']}s = {figures['job_events_per_s']:,} events/s; "
          f"{figures['job_over_scan']}x the bare scan ({figures['scan_s']}s); Spark start-up {figures['startup_s']}s "
          f"= {100 * figures['startup_share']:.0f}% of a cold run; {figures['jvm_cpu_us_per_event']} µs JVM CPU/event")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
