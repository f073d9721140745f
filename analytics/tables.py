"""The analytics tables, aggregated in Spark from the parsed events (analytics.events.parse).

Everything here stays distributed: each function returns a DataFrame; only the job collects the (small) results
it plots. A group's events are ordered by (partition, offset), their write order; wall-clock spans use ts_ms.
`ALL` rows (group_id "*") summarize every group together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.telemetry import event_schema as schema

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

ALL = "*"
HOUR_MS = 3_600_000
NICE_BUCKETS_MS = (1_000, 5_000, 10_000, 30_000, 60_000, 300_000, 900_000, 3_600_000, 6 * 3_600_000, 86_400_000)


@dataclass(frozen=True)
class TimeRange:
    start_ms: int
    end_ms: int

    @property
    def span_ms(self) -> int:
        return max(1, self.end_ms - self.start_ms)

    def bucket_ms(self, target_buckets: int = 60) -> int:
        """A round bucket width giving at most ~`target_buckets` buckets over the range (for the time plot)."""
        for width in NICE_BUCKETS_MS:
            if self.span_ms / width <= target_buckets:
                return width
        return NICE_BUCKETS_MS[-1] * -(-self.span_ms // (NICE_BUCKETS_MS[-1] * target_buckets))  # whole days


def reason_category(reason: "Column", cause_category: "Column") -> "Column":
    """event_schema.reason_category in Spark SQL: the cause_category mapped, else the same patterns (first match
    wins) on the reason text of an event without one."""
    from pyspark.sql import functions as F

    causes = F.create_map(*(F.lit(part) for pair in schema.CAUSE_CATEGORIES.items() for part in pair))
    expression = F.when(cause_category.isNotNull(), F.coalesce(causes[cause_category], F.lit(schema.OTHER_REASON)))
    for name, pattern in schema.REASON_CATEGORIES:
        expression = expression.when(reason.rlike(pattern), name)
    return expression.otherwise(schema.OTHER_REASON)


def _write_order():
    from pyspark.sql import Window

    return Window.partitionBy("group_id").orderBy("partition", "offset")


def _of(events: "DataFrame", *types: str) -> "DataFrame":
    from pyspark.sql import functions as F

    return events.filter(F.col("type").isin(list(types)))


def rebalances(events: "DataFrame", time_range: TimeRange) -> "DataFrame":
    """One row per rebalance: from the first rebalance_started with no rebalance open (a rebalance that goes back
    to PreparingRebalance is still one) to its rebalance_completed, whose duration_ms is the coordinator's own
    (monotonic clock). status: completed | in_progress (no completion yet: duration so far) |
    started_before_range (its start is outside the analysed range: reason unknown)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rb = _of(events, "rebalance_started", "rebalance_completed")
    is_completed = (F.col("type") == "rebalance_completed").cast("int")
    before = _write_order().rowsBetween(Window.unboundedPreceding, -1)
    rb = rb.withColumn("episode", F.coalesce(F.sum(is_completed).over(before), F.lit(0)))
    starts = (rb.filter(F.col("type") == "rebalance_started").groupBy("group_id", "episode").agg(
        F.min("ts_ms").alias("started_ms"),
        F.min_by("reason", "offset").alias("reason"),
        F.min_by("cause_category", "offset").alias("cause_category"),
        F.min_by("generation", "offset").alias("from_generation"),
        F.min_by("trace_id", "offset").alias("start_trace_id"),
        F.count(F.lit(1)).alias("triggers")))
    completions = rb.filter(F.col("type") == "rebalance_completed").select(
        "group_id", "episode", F.col("ts_ms").alias("completed_ms"), F.col("generation"), "member_count",
        "duration_ms", F.col("trace_id").alias("end_trace_id"))
    joined = starts.join(completions, ["group_id", "episode"], "full_outer")
    status = (F.when(F.col("completed_ms").isNull(), "in_progress")
              .when(F.col("started_ms").isNull(), "started_before_range").otherwise("completed"))
    # a completion without a duration (its owner loaded the group mid-rebalance): from the events' clocks
    duration = F.when(F.col("completed_ms").isNull(), F.lit(time_range.end_ms) - F.col("started_ms")).otherwise(
        F.coalesce(F.col("duration_ms"), F.col("completed_ms") - F.col("started_ms")))
    return joined.select(
        "group_id", "episode", status.alias("status"),
        F.timestamp_millis(F.coalesce("started_ms", F.col("completed_ms") - F.col("duration_ms"))).alias("started"),
        F.timestamp_millis("completed_ms").alias("completed"),
        duration.alias("duration_ms"), "reason",
        reason_category(F.col("reason"), F.col("cause_category")).alias("reason_category"),
        F.coalesce("triggers", F.lit(0)).alias("triggers"), "from_generation", "generation", "member_count",
        F.coalesce("end_trace_id", "start_trace_id").alias("trace_id"))


def state_time(events: "DataFrame", time_range: TimeRange) -> "DataFrame":
    """Milliseconds each group spent in each state: a state lasts until the group's next state_change, the last
    one until the end of the range."""
    from pyspark.sql import functions as F

    changes = _of(events, "state_change")
    until = F.lead("ts_ms").over(_write_order())
    changes = changes.withColumn("until_ms", F.coalesce(until, F.lit(time_range.end_ms)))
    return (changes.groupBy("group_id", F.col("new_state").alias("state"))
            .agg(F.sum(F.greatest(F.col("until_ms") - F.col("ts_ms"), F.lit(0))).alias("ms")))


def _with_all(frame: "DataFrame") -> "DataFrame":
    """The rows once per group and once more under group_id "*"."""
    from pyspark.sql import functions as F

    return frame.unionByName(frame.withColumn("group_id", F.lit(ALL)))


def group_summary(events: "DataFrame", episodes: "DataFrame", states: "DataFrame",
                  time_range: TimeRange) -> "DataFrame":
    from pyspark.sql import functions as F

    hours = time_range.span_ms / HOUR_MS

    def count_of(event_type: str) -> "Column":  # member_joined -> joined
        return F.sum((F.col("type") == event_type).cast("long")).alias(event_type.removeprefix("member_"))

    counts = _with_all(events).groupBy("group_id").agg(
        F.sum((F.col("type") == "rebalance_started").cast("long")).alias("rebalances"),
        count_of("member_joined"), count_of("member_left"), count_of("member_failed"),
        count_of("member_replaced"),
        # clients' transactions settled (exactly-once applications): their offsets committed or aborted
        F.sum((F.col("type") == "txn_offsets_committed").cast("long")).alias("txn_commits"),
        F.sum((F.col("type") == "txn_offsets_aborted").cast("long")).alias("txn_aborts"),
        F.percentile_approx("detection_lateness_ms", 0.5, 10_000).alias("detection_lateness_p50_ms"),
        F.max("detection_lateness_ms").alias("detection_lateness_max_ms"),
    ).withColumn("rebalances_per_hour", F.col("rebalances") / F.lit(hours))
    done = _with_all(episodes.filter(F.col("status") != "in_progress")).groupBy("group_id").agg(
        F.count(F.lit(1)).alias("completed_rebalances"),
        F.percentile_approx("duration_ms", 0.5, 10_000).alias("duration_p50_ms"),
        F.percentile_approx("duration_ms", 0.95, 10_000).alias("duration_p95_ms"),
        F.max("duration_ms").alias("duration_max_ms"),
        F.min("generation").alias("first_generation"), F.max("generation").alias("last_generation"),
        F.countDistinct("generation").alias("generations"))
    rebalancing = F.col("state").isin(list(schema.REBALANCING_STATES))
    per_group_time = states.groupBy("group_id").agg(
        F.sum(F.when(rebalancing, F.col("ms")).otherwise(0)).alias("rebalancing_ms"),
        F.sum(F.when(F.col("state") == "Empty", F.col("ms")).otherwise(0)).alias("empty_ms"),
        F.sum("ms").alias("observed_ms"))
    all_time = per_group_time.agg(*(F.sum(c).alias(c) for c in ("rebalancing_ms", "empty_ms", "observed_ms")))
    times = per_group_time.unionByName(all_time.withColumn("group_id", F.lit(ALL)))
    summary = counts.join(done, "group_id", "left").join(times, "group_id", "left")
    share = (lambda column: F.when(F.col("observed_ms") > 0, F.col(column) / F.col("observed_ms")))
    return summary.select(
        "group_id", "rebalances", "rebalances_per_hour", F.coalesce("completed_rebalances", F.lit(0))
        .alias("completed_rebalances"), "duration_p50_ms", "duration_p95_ms", "duration_max_ms",
        share("rebalancing_ms").alias("rebalancing_share"), share("empty_ms").alias("empty_share"),
        "rebalancing_ms", "empty_ms", "observed_ms", "joined", "left", "failed", "replaced",
        "txn_commits", "txn_aborts",
        "first_generation", "last_generation", "generations",
        (F.col("generations") / F.lit(hours)).alias("generations_per_hour"),
        "detection_lateness_p50_ms", "detection_lateness_max_ms")


def reasons(events: "DataFrame", time_range: TimeRange) -> "DataFrame":
    """Rebalance triggers (every rebalance_started) per group and reason category, and their rate per hour."""
    from pyspark.sql import functions as F

    started = _of(events, "rebalance_started").select("group_id", reason_category(
        F.col("reason"), F.col("cause_category")).alias("reason_category"))
    return (_with_all(started).groupBy("group_id", "reason_category").agg(F.count(F.lit(1)).alias("rebalances"))
            .withColumn("per_hour", F.col("rebalances") / F.lit(time_range.span_ms / HOUR_MS)))


def member_events(events: "DataFrame") -> "DataFrame":
    """Joins, leaves, failures and static replacements per group, by reason where there is one."""
    from pyspark.sql import functions as F

    members = _of(events, "member_joined", "member_left", "member_failed", "member_replaced")
    return (_with_all(members.select("group_id", "type", "reason"))
            .groupBy("group_id", "type", "reason").agg(F.count(F.lit(1)).alias("events")))


def failing_members(events: "DataFrame") -> "DataFrame":
    """Failures (member_failed) per member identity: client id, host and instance id come from the member's
    member_joined (a static member by its instance id, so they survive replacements)."""
    from pyspark.sql import functions as F

    joined = _of(events, "member_joined")
    dynamic = joined.select("group_id", "member_id", F.col("client_id").alias("d_client"),
                            F.col("client_host").alias("d_host"))
    static = (joined.filter(F.col("group_instance_id").isNotNull()).groupBy("group_id", "group_instance_id")
              .agg(F.max_by("client_id", "offset").alias("s_client"), F.max_by("client_host", "offset")
                   .alias("s_host")))
    failed = _of(events, "member_failed").select("group_id", "member_id", "group_instance_id", "reason", "ts_ms",
                                                 "offset", "trace_id")
    resolved = (failed.join(dynamic, ["group_id", "member_id"], "left")
                .join(static, ["group_id", "group_instance_id"], "left"))
    return (resolved.select(
        "group_id", F.coalesce("s_client", "d_client", F.lit("?")).alias("client_id"),
        F.coalesce("s_host", "d_host", F.lit("?")).alias("client_host"), "group_instance_id", "member_id",
        "reason", "ts_ms", "offset", "trace_id")
        .groupBy("group_id", "client_id", "client_host", "group_instance_id").agg(
            F.count(F.lit(1)).alias("failures"), F.countDistinct("member_id").alias("member_ids"),
            F.array_sort(F.collect_set("reason")).alias("reasons"),
            F.timestamp_millis(F.max("ts_ms")).alias("last_failed"),
            F.max_by("trace_id", "offset").alias("last_trace_id")))


def rebalances_over_time(events: "DataFrame", time_range: TimeRange) -> "DataFrame":
    from pyspark.sql import functions as F

    width = time_range.bucket_ms()
    started = _of(events, "rebalance_started")
    bucket = (F.floor((F.col("ts_ms") - F.lit(time_range.start_ms)) / F.lit(width)) * F.lit(width)
              + F.lit(time_range.start_ms))
    return (started.groupBy("group_id", bucket.cast("long").alias("bucket_start_ms"))
            .agg(F.count(F.lit(1)).alias("rebalances")).withColumn("bucket_ms", F.lit(width)))


def duration_histogram(episodes: "DataFrame") -> "DataFrame":
    """Completed rebalance durations in power-of-two buckets [lower, upper) ms, per group and overall."""
    from pyspark.sql import functions as F

    done = episodes.filter(F.col("status") != "in_progress")
    exponent = F.floor(F.log2(F.greatest(F.col("duration_ms"), F.lit(1)))).cast("int")
    return (_with_all(done.select("group_id", exponent.alias("exponent"))).groupBy("group_id", "exponent")
            .agg(F.count(F.lit(1)).alias("rebalances"))
            .select("group_id", F.pow(F.lit(2), "exponent").cast("long").alias("lower_ms"),
                    F.pow(F.lit(2), F.col("exponent") + 1).cast("long").alias("upper_ms"), "rebalances"))


def skipped(parsed: "DataFrame") -> "DataFrame":
    from pyspark.sql import functions as F

    return (parsed.filter(F.col("problem").isNotNull()).groupBy("problem")
            .agg(F.count(F.lit(1)).alias("records"), F.min("offset").alias("first_offset")))
