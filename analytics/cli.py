"""`coordinator analyze`: argument parsing and console output; pyspark is imported only when it runs."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

_RELATIVE = re.compile(r"^(\d+)\s*(s|m|h|d)$")
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

DESCRIPTION = """Rebalance analytics over the coordinator's event topic, on Spark (PySpark, local mode unless
--master). Reads the topic with Spark's Kafka source; writes Parquet tables (group_summary, rebalances, reasons,
member_events, failing_members, state_time, rebalances_over_time, duration_histogram, skipped) and report.html
to --out. --follow instead runs Structured Streaming and prints per-group counts per window as they update.
Needs the `spark` extra (pip install '.[spark]') and Java 17+. docs/analytics.md tells more."""


def parse_time(text: str, now_ms: int | None = None) -> int:
    """Epoch milliseconds from ISO 8601 (UTC unless an offset is given), epoch ms, or an age such as 2h
    (now minus two hours: s, m, h, d)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    relative = _RELATIVE.match(text)
    if relative:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        return now_ms - int(relative.group(1)) * _UNIT_MS[relative.group(2)]
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (ISO 8601, epoch ms, or an age like 2h)")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return int(moment.timestamp() * 1000)


def _kafka_option(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    name = name.strip()
    return (name if name.startswith("kafka.") else f"kafka.{name}"), value.strip()


def add_analyze_command(commands: Any) -> None:
    env = os.environ.get
    analyze = commands.add_parser("analyze", help="rebalance analytics over the event topic (PySpark)",
                                  description=DESCRIPTION)
    analyze.add_argument("--bootstrap-server", default=env("KAFKA_BOOTSTRAP"),
                         help="the Kafka cluster holding the event topic (env KAFKA_BOOTSTRAP)")
    analyze.add_argument("--event-topic", default=env("COORDINATOR_EVENT_TOPIC", "__coordinator_events"))
    analyze.add_argument("--since", type=parse_time, help="first event time: ISO 8601, epoch ms, or an age (2h)")
    analyze.add_argument("--until", type=parse_time, help="end of the range (exclusive), same forms as --since")
    analyze.add_argument("--out", type=Path, default=Path("analytics-out"),
                         help="directory for the Parquet tables, report.html and summary.json")
    analyze.add_argument("--master", default=env("SPARK_MASTER"),
                         help="Spark master URL (env SPARK_MASTER); default local[*]")
    analyze.add_argument("--jaeger-url", default=env("JAEGER_UI_URL"),
                         help="Jaeger UI base URL: the report links trace ids to it (env JAEGER_UI_URL)")
    analyze.add_argument("--kafka-option", type=_kafka_option, action="append", default=[], metavar="NAME=VALUE",
                         help="a Kafka client setting for Spark's source, e.g. security.protocol=SSL (repeatable)")
    follow = analyze.add_argument_group("--follow (Structured Streaming)")
    follow.add_argument("--follow", action="store_true",
                        help="stream: print per-group counts per window as events arrive (Ctrl-C stops)")
    follow.add_argument("--checkpoint-dir", type=Path,
                        help="offsets and window state, so a restart resumes (default: OUT/checkpoint)")
    follow.add_argument("--window", default="1 minute", help="window length (Spark interval, default 1 minute)")
    follow.add_argument("--trigger-seconds", type=float, default=5.0, help="micro-batch interval (default 5)")
    follow.add_argument("--from-beginning", action="store_true",
                        help="a fresh checkpoint starts at the topic's beginning, not its end")
    follow.add_argument("--follow-seconds", type=float, help="stop after this long (default: until interrupted)")
    analyze.set_defaults(run=run_analyze)


async def run_analyze(args: argparse.Namespace) -> int:
    # Spark's py4j calls block; nothing else runs on this loop, so they run here directly.
    return analyze(args)


def analyze(args: argparse.Namespace) -> int:
    if not args.bootstrap_server:
        print("coordinator analyze: --bootstrap-server (or KAFKA_BOOTSTRAP) is required", file=sys.stderr)
        return 2
    if args.since is not None and args.until is not None and args.since >= args.until:
        print("coordinator analyze: --since must be before --until", file=sys.stderr)
        return 2
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("coordinator analyze needs PySpark: pip install '.[spark]' (bash scripts/setup.sh does)",
              file=sys.stderr)
        return 2
    from analytics.events import Source
    from analytics.session import build_session

    source = Source(args.bootstrap_server, args.event_topic, args.since, args.until, tuple(args.kafka_option))
    started = time.monotonic()
    _progress(f"starting Spark ({args.master or 'local[*]'})")
    spark = build_session(args.master)
    _progress(f"Spark ready in {time.monotonic() - started:.1f}s")
    try:
        if args.follow:
            return _follow(spark, source, args)
        return _batch(spark, source, args, started)
    finally:
        spark.stop()


def _progress(message: str) -> None:
    print(f"analyze: {message}", file=sys.stderr, flush=True)


def _batch(spark: Any, source: Any, args: argparse.Namespace, started: float) -> int:
    from analytics.job import run_batch
    from analytics.report import millis, percent

    result = run_batch(spark, source, args.out, args.jaeger_url, progress=_progress)
    groups = sum(1 for row in result.summary if row["group_id"] != "*")
    print(f"{result.events} events, {groups} groups, "
          f"{sum(result.skipped.values())} records skipped {dict(sorted(result.skipped.items())) or ''}")
    print(f"{'group':<32} {'rebalances':>10} {'p50':>9} {'p95':>9} {'max':>9} {'rebal%':>7} {'joined':>6} "
          f"{'left':>5} {'failed':>6}")
    for row in result.summary[:50]:
        name = "(all groups)" if row["group_id"] == "*" else row["group_id"]
        print(f"{name[:32]:<32} {row['rebalances']:>10} {millis(row['duration_p50_ms']):>9} "
              f"{millis(row['duration_p95_ms']):>9} {millis(row['duration_max_ms']):>9} "
              f"{percent(row['rebalancing_share']):>7} {row['joined']:>6} {row['left']:>5} {row['failed']:>6}")
    print(f"tables and report: {args.out.resolve()} (report.html); {time.monotonic() - started:.1f}s in all")
    return 0


def _follow(spark: Any, source: Any, args: argparse.Namespace) -> int:
    from analytics.job import run_follow

    checkpoint = args.checkpoint_dir or args.out / "checkpoint"
    _progress(f"following {source.topic}; checkpoint {checkpoint}; window {args.window}; Ctrl-C stops")

    def show(batch_id: int, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            window = row["window"]
            print(f"batch={batch_id} window={window['start']:%H:%M:%S}-{window['end']:%H:%M:%S} "
                  f"group={row['group_id']} rebalances={row['rebalances']} completed={row['completed']} "
                  f"failed={row['failed']} left={row['left']} joined={row['joined']} skipped={row['skipped']}",
                  flush=True)

    try:
        run_follow(spark, source, checkpoint, show, trigger_seconds=args.trigger_seconds, window=args.window,
                   starting="earliest" if args.from_beginning else "latest", max_seconds=args.follow_seconds)
    except KeyboardInterrupt:
        _progress("interrupted; the checkpoint keeps the position")
    return 0
