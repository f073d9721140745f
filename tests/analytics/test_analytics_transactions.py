"""Client transactions in the group summary: each group's transactional offset commits and aborts counted from
`txn_offsets_committed`/`txn_offsets_aborted` (pending events are not outcomes), and summed over every group."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from analytics.events import parse
from coordinator.telemetry.event_schema import new_event, problem_of


def _txn(event_type: str, group: str, ts_ms: int, producer_id: int) -> dict[str, Any]:
    outcome = event_type.removeprefix("txn_offsets_")
    fields: dict[str, Any] = {"duration_ms": 40} if outcome != "pending" else {}
    return new_event(event_type, group, ts_ms, transactional_id=f"app-{producer_id}", producer_id=producer_id,
                     producer_epoch=0, partition_count=2, outcome=outcome, **fields)


def test_group_summary_counts_each_groups_transactional_commits_and_aborts(spark: Any) -> None:
    from analytics.tables import ALL, TimeRange, group_summary, rebalances, state_time

    events = [
        _txn("txn_offsets_pending", "eos", 1_000, 7), _txn("txn_offsets_committed", "eos", 1_040, 7),
        _txn("txn_offsets_pending", "eos", 1_100, 7), _txn("txn_offsets_committed", "eos", 1_140, 7),
        _txn("txn_offsets_pending", "eos", 1_200, 7), _txn("txn_offsets_aborted", "eos", 1_240, 7),
        _txn("txn_offsets_pending", "other", 1_300, 8), _txn("txn_offsets_aborted", "other", 1_340, 8),
        _txn("txn_offsets_pending", "other", 1_400, 8),  # still open at the range's end
        new_event("state_change", "plain", 1_000, old_state="Empty", new_state="PreparingRebalance", generation=0),
    ]
    assert all(problem_of(event) is None for event in events)
    moment = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    frame = spark.createDataFrame([(json.dumps(e).encode(), 0, offset, moment) for offset, e in enumerate(events)],
                                  "value binary, partition int, offset long, timestamp timestamp")
    parsed = parse(frame).filter("problem is null")
    time_range = TimeRange(0, 2_000)
    summary = group_summary(parsed, rebalances(parsed, time_range), state_time(parsed, time_range), time_range)
    counts = {row["group_id"]: (row["txn_commits"], row["txn_aborts"]) for row in summary.collect()}
    assert counts == {"eos": (2, 1), "other": (0, 1), "plain": (0, 0), ALL: (2, 2)}
