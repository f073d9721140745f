"""`--follow`: Structured Streaming picks up events produced after it started (and not those before), and a
restart with the same checkpoint resumes: events written while it was down are counted once, on top of the
window state it had."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from analytics import synthetic
from analytics.events import Source
from analytics.job import run_follow
from coordinator.telemetry.event_schema import new_event
from tests.support.service import unique

TIMEOUT_S = 180


class Follower:
    """run_follow in a thread, its updates collected; stopped on request."""

    def __init__(self, spark: Any, source: Source, checkpoint: Path) -> None:
        self.rows: list[dict[str, Any]] = []
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(spark, source, checkpoint), daemon=True)
        self.thread.start()

    def _run(self, spark: Any, source: Source, checkpoint: Path) -> None:
        try:
            run_follow(spark, source, checkpoint, lambda _batch, rows: self.rows.extend(rows), trigger_seconds=1,
                       should_stop=self.stop.is_set, on_ready=self.ready.set, max_seconds=TIMEOUT_S * 2)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def latest(self, group: str) -> dict[str, Any] | None:
        rows = [row for row in self.rows if row["group_id"] == group]
        return rows[-1] if rows else None

    def wait_for(self, group: str, condition: Any) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.error is None, self.error
            row = self.latest(group)
            if row is not None and condition(row):
                return row
            time.sleep(0.2)
        raise AssertionError(f"no update for {group} satisfying the condition; rows: {self.rows}")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        assert self.error is None, self.error


def rebalance(group: str, ts_ms: int, failed: bool = False) -> list[tuple[str, dict[str, Any]]]:
    events = []
    if failed:
        events.append(new_event("member_failed", group, ts_ms, member_id="m-1", group_instance_id=None,
                                reason="session timeout"))
    events += [new_event("rebalance_started", group, ts_ms, generation=1, reason="x on heartbeat expiration"),
               new_event("rebalance_completed", group, ts_ms + 10, generation=2, member_count=1, duration_ms=10)]
    return [(group, event) for event in events]


def test_follow_counts_new_events_and_resumes_from_its_checkpoint(kafka_bootstrap: str, spark: Any,
                                                                  tmp_path: Path) -> None:
    topic = unique("__events-follow")
    minute = (int(time.time() * 1000) // 60_000) * 60_000 + 30_000  # every event in one window
    synthetic.write(kafka_bootstrap, topic, iter(rebalance("before", minute) * 3))  # there before it starts
    source = Source(kafka_bootstrap, topic)
    checkpoint = tmp_path / "checkpoint"

    first = Follower(spark, source, checkpoint)
    try:
        assert first.ready.wait(TIMEOUT_S), first.error
        synthetic.write(kafka_bootstrap, topic, iter(rebalance("live", minute, failed=True) * 2), [b"garbage"])
        live = first.wait_for("live", lambda row: row["rebalances"] == 2)
        assert (live["failed"], live["completed"], live["skipped"]) == (2, 2, 0)
        assert first.wait_for("-", lambda row: row["skipped"] == 1)["rebalances"] == 0
    finally:
        first.close()
    assert first.latest("before") is None  # events from before the start are not counted

    synthetic.write(kafka_bootstrap, topic, iter(rebalance("live", minute)))  # written while nobody follows
    second = Follower(spark, source, checkpoint)
    try:
        resumed = second.wait_for("live", lambda row: row["rebalances"] >= 3)
        assert (resumed["rebalances"], resumed["failed"]) == (3, 2)  # window state restored, new event added once
    finally:
        second.close()
    assert second.latest("before") is None
