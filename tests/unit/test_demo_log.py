"""The demo's log handling: every line to the file, the story's lines to the terminal as short event lines that
fit the width (coordinator/demo_log.py), fed through the real logging module with the coordinator's own lines."""

from __future__ import annotations

import logging
from pathlib import Path

from coordinator.demo_log import DemoLog, event_lines

MEMBER = "coordinator-simulate-6d1c6d78-11d5-416c-94c7-d7fecf8a0fb2"
TRACE = "2e4e45725a61f7c761fddb031c2f4b02"


def test_the_story_reaches_the_terminal_and_everything_the_file(tmp_path: Path) -> None:
    demo_log = DemoLog(tmp_path / "demo.log", traced=True)
    demo_log.open_log()
    try:
        shard, tracer = logging.getLogger("coordinator.group"), logging.getLogger("coordinator.telemetry")
        shard.info("event=member_added group=demo-0000 member=%s", MEMBER)  # not a story line
        shard.info("Member %s in group %s has failed, removing it from the group", MEMBER, "demo-0000")
        tracer.info("event=rebalance_trace_started group=demo-0000 generation=1 reason_category=session_timeout "
                    "trace_id=%s", TRACE)
        shard.info("event=rebalance_complete group=demo-0000 generation=2 members=3 duration_ms=9677")  # traced
        tracer.info("event=rebalance_trace_completed group=demo-0000 generation=2 members=3 duration_ms=9677 "
                    "trace_id=%s", TRACE)
        logging.getLogger("coordinator.runtime").warning("event=loop_stall lag_ms=120")
        logging.getLogger("coordinator.storage.librdkafka.state-producer-0").warning("GETPID something")
        logging.getLogger("coordinator.server").error("event=startup_failed error=%s", "x" * 200)
        events = demo_log.drain()
    finally:
        demo_log.close_log()
    assert [e.kind for e in events] == ["failed", "rebalance", "error"]
    failed, rebalance, error = events
    assert failed.text == f"Member {MEMBER} in group demo-0000 has failed, removing it from the group"
    assert (rebalance.trace_id, rebalance.reason, rebalance.took_ms) == (TRACE, "session_timeout", 9677)
    assert demo_log.warnings == {"loop_stall": 1, "librdkafka": 1} and demo_log.errors == 1
    written = (tmp_path / "demo.log").read_text()
    assert "INFO coordinator.group event=member_added" in written and "has failed" in written
    assert demo_log not in logging.getLogger().handlers  # the terminal's handlers are back

    for width in (60, 80):
        lines = [line for event in events for line in event_lines(event, width)]
        assert all(len(line) <= width for line in lines), lines
    at_80 = event_lines(rebalance, 80)
    assert len(at_80) == 1 and at_80[0].endswith("demo-0000 generation 2 in 9677 ms, session_timeout · trace 2e4e4572")
    assert event_lines(rebalance, 120)[0].endswith(f"trace {TRACE}")  # whole when it fits
    wrapped = event_lines(failed, 80)
    assert len(wrapped) == 2 and " ".join(line.strip() for line in wrapped).endswith(failed.text)
    assert len(event_lines(error, 80)) == 1  # an ERROR: one line, the file has the rest
    assert event_lines(failed, None) == [event_lines(failed, None)[0]] and failed.text in event_lines(failed, None)[0]


def test_without_tracing_the_coordinators_rebalance_line_is_the_event(tmp_path: Path) -> None:
    demo_log = DemoLog(tmp_path / "demo.log", traced=False)
    demo_log.open_log()
    try:
        logging.getLogger("coordinator.group").info(
            "event=rebalance_complete group=g generation=4 members=2 duration_ms=31")
        events = demo_log.drain()
    finally:
        demo_log.close_log()
    assert [(e.kind, e.trace_id, e.took_ms) for e in events] == [("rebalance", None, 31)]
    assert event_lines(events[0], 80)[0].endswith("↻ g generation 4 in 31 ms")


def test_a_consumer_groups_fence_and_rebalance_reach_the_terminal(tmp_path: Path) -> None:
    """A KIP-848 group's lines: Kafka 4.1's fence line, and its rebalance told by group epoch."""
    demo_log = DemoLog(tmp_path / "demo.log", traced=True)
    demo_log.open_log()
    try:
        shard, tracer = logging.getLogger("coordinator.group"), logging.getLogger("coordinator.telemetry")
        shard.info("[GroupId %s] %s", "demo-kip848",
                   "Member m-1 fenced from the group because the member session expired.")
        tracer.info("event=rebalance_trace_started group=demo-kip848 protocol=consumer group_epoch=3 "
                    "reason_category=session_timeout trace_id=%s", TRACE)
        tracer.info("event=rebalance_trace_completed group=demo-kip848 protocol=consumer group_epoch=3 members=1 "
                    "duration_ms=150 trace_id=%s", TRACE)
        events = demo_log.drain()
    finally:
        demo_log.close_log()
    assert [e.kind for e in events] == ["failed", "rebalance"]
    assert events[0].text.endswith("Member m-1 fenced from the group because the member session expired.")
    assert events[1].text == "↻ demo-kip848 group epoch 3 in 150 ms, session_timeout"


def test_the_closing_summary_counts_what_both_sets_of_real_clients_produced(tmp_path: Path) -> None:
    """The relay's consumers and the KIP-848 consumers each have a producer on the one demo topic, and each group
    reads all of it: read counts are judged against both producers' records, not one's (which made every group look
    as if it read records twice)."""
    from coordinator.demo import closing_lines
    from coordinator.loadgen.real import RealClients

    relay = RealClients("127.0.0.1:1", "demo-orders", 2, "demo-real")
    kip848 = RealClients("127.0.0.1:1", "demo-orders", 2, "demo-kip848", group_protocol="consumer")
    relay.produced, kip848.produced = 1165, 292
    for clients, read in ((relay, (725, 732)), (kip848, (716, 741))):
        for stats, records in zip(clients.consumers, read):
            stats.records = records
    summary = {"rebalances": {"by_reason": {}, "count": 0, "duration_ms": {}},
               "failures": {"injected": {}, "detected_once": 0, "to_detect": 0},
               "real_consumers": relay.summary(), "consumer_protocol_consumers": kip848.summary()}
    lines = closing_lines(65, summary, DemoLog(tmp_path / "demo.log", traced=False), None, tmp_path)
    read = [line for line in lines if "records read" in line]
    assert read == ["  records read through the relay (demo-real): confluent-kafka 725, aiokafka 732 "
                    "(of 1457 produced to demo-orders)",
                    "  records read by group.protocol=consumer (demo-kip848): demo-kip848-0 716, demo-kip848-1 741 "
                    "(of 1457 produced to demo-orders)"]
