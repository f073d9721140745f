"""`coordinator simulate` against `coordinator serve` on a real Kafka broker: 20 groups × 10 members with hangs and
crashes injected. Every surviving member ends Stable, every injected failure is detected exactly once (the
member's UNKNOWN_MEMBER_ID on return, and exactly one member_failed event from the coordinator's event topic),
and no unexpected error code is seen."""

from __future__ import annotations

import json
import sys

from coordinator.loadgen import ScheduledFailure, SimOptions, Simulation
from tests.support.service import service, unique, until_loaded

SETTINGS = ("group.initial.rebalance.delay.ms=300", "group.min.session.timeout.ms=1000")
SESSION_MS = 5_000  # long enough that no healthy member expires on a busy machine


async def test_twenty_groups_of_ten_with_hangs_and_crashes(kafka_bootstrap: str) -> None:
    events = unique("__events")
    async with service(kafka_bootstrap, unique("__state"), *SETTINGS, event_topic=events) as running:
        admin = await running.client()
        await until_loaded(admin)
        await admin.close()
        options = SimOptions(
            coordinator=("127.0.0.1", running.port), bootstrap_server=kafka_bootstrap, groups=20, members=10,
            topic=unique("simulated"), partitions=12, group_prefix=unique("sim"), session_ms=SESSION_MS,
            rebalance_ms=20_000, heartbeat_ms=1_000, commit_interval_ms=2_000, duration_s=8, settle_timeout_s=60,
            schedule=(ScheduledFailure("hang", 3, 2.0), ScheduledFailure("crash", 3, 3.0)), seed=11,
            event_topic=events)
        summary = await Simulation(options).run()
        print(json.dumps(summary), file=sys.stderr)
        assert summary["members_stable"] == summary["members_surviving"] == 200, summary
        assert summary["groups_stable"] == 20 and summary["groups_misassigned"] == []
        failures = summary["failures"]
        assert failures["injected"] == {"hang": 3, "crash": 3}
        assert failures["detected_once"] == failures["to_detect"] == 6, failures
        assert failures["expiry_events_per_failure"] == [1] * 6, failures
        assert summary["unexpected_errors"] == {}, summary["error_codes"]
        assert summary["error_codes"]["Heartbeat"]["UNKNOWN_MEMBER_ID"] == 6  # the six probes, nobody else
        lateness = summary["detection_lateness_ms"]
        assert lateness["count"] == 6
        # never early (the coordinator's deadline counts from receipt, ms-rounded); bounded even on a busy machine
        assert -2 <= lateness["p50"] <= lateness["max"] < SESSION_MS, lateness
        assert summary["ok"]
        assert "has failed, removing it from the group" in running.log_text()
        assert await running.terminate() == 0
