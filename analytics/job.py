"""The batch job and `--follow`: Kafka → Spark → Parquet tables + an HTML report, or live windowed counts."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analytics import report, tables
from analytics.events import Source, parse, read_batch, read_stream
from analytics.tables import ALL, TimeRange

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("analytics")

TABLES = ("group_summary", "rebalances", "reasons", "member_events", "failing_members", "state_time",
          "rebalances_over_time", "duration_histogram", "skipped")
PLOTTED_GROUPS = 8  # the time plot's series: the groups with most rebalances
TOP_FAILING = 15
SLOWEST = 15


@dataclass
class BatchResult:
    out_dir: Path
    events: int  # valid events in the range
    skipped: dict[str, int]  # problem -> records
    time_range: TimeRange
    summary: list[dict[str, Any]]  # group_summary rows, the "*" row first
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> wall seconds

    def overall(self) -> dict[str, Any]:
        return next(row for row in self.summary if row["group_id"] == ALL)

    def group(self, group_id: str) -> dict[str, Any]:
        return next(row for row in self.summary if row["group_id"] == group_id)


def run_batch(spark: "SparkSession", source: Source, out_dir: Path, jaeger_url: str | None = None,
              progress: Callable[[str], None] = lambda _: None) -> BatchResult:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    parsed = parse(read_batch(spark, source)).persist(StorageLevel.MEMORY_AND_DISK)
    frames: dict[str, "DataFrame"] = {}
    try:
        progress(f"reading {source.topic} from {source.bootstrap}")
        in_range = parsed.filter(F.col("problem").isNull())
        if source.since_ms is not None:
            in_range = in_range.filter(F.col("ts_ms") >= source.since_ms)
        if source.until_ms is not None:
            in_range = in_range.filter(F.col("ts_ms") < source.until_ms)
        extent = in_range.agg(F.count(F.lit(1)).alias("n"), F.min("ts_ms").alias("lo"),
                              F.max("ts_ms").alias("hi")).first()
        assert extent is not None  # an aggregate without grouping has exactly one row
        read_s = time.monotonic() - started
        now_ms = int(time.time() * 1000)
        time_range = TimeRange(source.since_ms if source.since_ms is not None else (extent["lo"] or now_ms),
                               source.until_ms if source.until_ms is not None else (extent["hi"] or now_ms))
        progress(f"{extent['n']} events between {report.iso(time_range.start_ms)} and "
                 f"{report.iso(time_range.end_ms)}; aggregating")
        frames = _tables(parsed, in_range, time_range)
        for name in TABLES:
            frames[name].write.mode("overwrite").parquet(str(out_dir / name))
            progress(f"wrote {out_dir / name}")
        aggregate_s = time.monotonic() - started - read_s
        result = BatchResult(out_dir, int(extent["n"]), {}, time_range, [])
        data = _report_data(spark, out_dir, result, jaeger_url)
        (out_dir / "report.html").write_text(report.render_html(data))
        result.seconds = {"read": read_s, "aggregate_write": aggregate_s,
                          "report": time.monotonic() - started - read_s - aggregate_s}
        (out_dir / "summary.json").write_text(json.dumps(
            {"events": result.events, "skipped": result.skipped, "since_ms": time_range.start_ms,
             "until_ms": time_range.end_ms, "groups": result.summary}, indent=1, default=str))
        return result
    finally:
        for frame in (parsed, frames.get("rebalances"), frames.get("state_time")):
            if frame is not None:
                frame.unpersist()


def _tables(parsed: "DataFrame", events: "DataFrame", time_range: TimeRange) -> dict[str, "DataFrame"]:
    episodes = tables.rebalances(events, time_range).cache()  # three tables use each of these two
    states = tables.state_time(events, time_range).cache()
    return {
        "group_summary": tables.group_summary(events, episodes, states, time_range),
        "rebalances": episodes,
        "reasons": tables.reasons(events, time_range),
        "member_events": tables.member_events(events),
        "failing_members": tables.failing_members(events),
        "state_time": states,
        "rebalances_over_time": tables.rebalances_over_time(events, time_range),
        "duration_histogram": tables.duration_histogram(episodes),
        "skipped": tables.skipped(parsed),
    }


def _report_data(spark: "SparkSession", out_dir: Path, result: BatchResult,
                 jaeger_url: str | None) -> report.ReportData:
    """Read back the written tables and collect only the small parts that the report shows."""
    from pyspark.sql import functions as F

    def table(name: str) -> "DataFrame":
        return spark.read.parquet(str(out_dir / name))

    def rows(frame: "DataFrame") -> list[dict[str, Any]]:
        return [row.asDict(recursive=True) for row in frame.collect()]

    summary = rows(table("group_summary").orderBy(F.col("group_id") != ALL, F.desc("rebalances"), "group_id"))
    result.summary = summary
    result.skipped = {row["problem"]: row["records"] for row in rows(table("skipped"))}
    top_groups = [row["group_id"] for row in summary if row["group_id"] != ALL][:PLOTTED_GROUPS]
    return report.ReportData(
        time_range=(result.time_range.start_ms, result.time_range.end_ms),
        events=result.events,
        skipped=result.skipped,
        summary=summary,
        reasons=rows(table("reasons").orderBy("group_id", F.desc("rebalances"))),
        over_time=rows(table("rebalances_over_time").filter(F.col("group_id").isin(top_groups))
                       .orderBy("group_id", "bucket_start_ms")),
        bucket_ms=result.time_range.bucket_ms(),
        durations=rows(table("duration_histogram").filter(F.col("group_id") == ALL).orderBy("lower_ms")),
        failing=rows(table("failing_members").orderBy(F.desc("failures"), "group_id", "client_id")
                     .limit(TOP_FAILING)),
        slowest=rows(table("rebalances").filter(F.col("status") != "started_before_range")
                     .orderBy(F.desc("duration_ms")).limit(SLOWEST)),
        member_events=rows(table("member_events").filter(F.col("group_id") == ALL).orderBy("type", "reason")),
        jaeger_url=jaeger_url,
    )


def run_follow(spark: "SparkSession", source: Source, checkpoint_dir: Path,
               on_update: Callable[[int, list[dict[str, Any]]], None],
               trigger_seconds: float = 5.0, window: str = "1 minute", starting: str = "latest",
               should_stop: Callable[[], bool] = lambda: False, max_seconds: float | None = None,
               on_ready: Callable[[], None] = lambda: None) -> None:
    """Structured Streaming over the topic: per group and `window`, counts of rebalances, failures, joins and
    leaves (and skipped records, under group "-" when the record has no group), updated every trigger;
    `on_update(batch_id, rows)` receives each micro-batch's changed windows. The checkpoint holds the offsets and the window state, so a restart with the
    same directory resumes where it stopped. `on_ready()` runs once the first micro-batch has fixed the starting
    offsets (events produced after it are counted). Runs until `should_stop()`, `max_seconds` or an interrupt."""
    from pyspark.sql import functions as F

    parsed = parse(read_stream(spark, source, starting))
    counts = (parsed.withWatermark("event_time", "10 minutes")
              .groupBy(F.window(F.coalesce("event_time", F.col("kafka_timestamp")), window).alias("window"),
                       F.coalesce("group_id", F.lit("-")).alias("group_id"))
              .agg(*(F.sum(condition.cast("long")).alias(name) for name, condition in _follow_counts(F))))

    def each_batch(batch: "DataFrame", batch_id: int) -> None:
        on_update(batch_id, [row.asDict(recursive=True) for row in batch.orderBy("window", "group_id").collect()])

    query = (counts.writeStream.outputMode("update").foreachBatch(each_batch)
             .option("checkpointLocation", str(checkpoint_dir)).trigger(processingTime=f"{trigger_seconds} seconds")
             .queryName("coordinator-follow").start())
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    ready = False
    try:
        while query.isActive and not should_stop() and (deadline is None or time.monotonic() < deadline):
            # seconds: pyspark takes a float, though its hint says int
            query.awaitTermination(0.5)  # type: ignore[arg-type]
            if not ready and query.lastProgress is not None:
                ready = True
                on_ready()
    finally:
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"follow query failed: {query.exception()}")


def _follow_counts(F: Any) -> list[tuple[str, Any]]:
    valid = F.col("problem").isNull()
    return [
        ("rebalances", valid & (F.col("type") == "rebalance_started")),
        ("completed", valid & (F.col("type") == "rebalance_completed")),
        ("failed", valid & (F.col("type") == "member_failed")),
        ("left", valid & (F.col("type") == "member_left")),
        ("joined", valid & (F.col("type") == "member_joined")),
        ("skipped", F.col("problem").isNotNull()),
    ]
