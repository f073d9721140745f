"""`coordinator trace`'s model and renderer on traces captured from a real Jaeger (jaeger_rebalances.json: the
/api/traces answer of the project's Jaeger during a `coordinator demo` run: a session-timeout rebalance, one where
two members never re-joined, a group's first rebalance, and an OffsetCommit request trace)."""

from __future__ import annotations

import argparse
import io
import json
import re
from pathlib import Path

import pytest

from coordinator.telemetry.trace_command import run_trace
from coordinator.telemetry.trace_render import duration, render_list, render_rebalance, short_member, to_text
from coordinator.telemetry.trace_view import TraceSourceError, rebalances_from_jaeger_json

CAPTURED = Path(__file__).with_name("jaeger_rebalances.json")
SESSION_TIMEOUT = "5567628e7d7e02b6071579bcc68111bb"
NEVER_JOINED = "b8c423b1082905e50d35f31b04c3ad18"
FIRST = "e216a3a2c635329b19ff69985de4105b"
FAILED_MEMBER = "coordinator-simulate-5ddaefc0-3a3b-47b4-9990-da97b475ce78"


def rebalances() -> dict[str, object]:
    return {r.trace_id: r for r in rebalances_from_jaeger_json(json.loads(CAPTURED.read_text()))}


def test_only_rebalance_traces_are_kept_oldest_first_with_their_tree() -> None:
    document = json.loads(CAPTURED.read_text())
    assert any(s["operationName"] == "OffsetCommit" for t in document["data"] for s in t["spans"])
    found = rebalances_from_jaeger_json(document)
    assert [r.trace_id for r in found] == [FIRST, SESSION_TIMEOUT, NEVER_JOINED]
    r = found[1]
    assert r.group == "demo-0001"
    assert [c.name for c in r.root.children] == ["join phase", "sync phase"]
    join, sync = r.root.children
    assert all(c.name.startswith("JoinGroup wait ") for c in join.children)
    assert "state-topic write" in [c.name for c in sync.children]
    assert [e.fields["message"] for e in r.failures()] == [
        f"Member {FAILED_MEMBER} in group demo-0001 has failed, removing it from the group"]
    assert r.linked_trace_ids  # the previous rebalance of the group


def test_waterfall_shows_phases_member_waits_and_the_failed_line_within_the_width() -> None:
    r = rebalances()[SESSION_TIMEOUT]
    text = to_text(render_rebalance(r, 200))
    assert "rebalance of demo-0001  generation 1 → 2 · 902 ms · stable" in text
    assert f"trace {SESSION_TIMEOUT}" in text
    assert "[session_timeout]" in text
    for label in ("join phase", "sync phase", "state-topic write", "JoinGroup coordinator-simulate-9acd… (last)",
                  "SyncGroup coordinator-simulate-168f…"):
        assert re.search(rf"^[│├└ ]*{re.escape(label)} +[+-]", text, re.M), label
    # the failed member: Kafka's whole line, and its fields
    assert f"member failed: Member {FAILED_MEMBER} in group demo-0001 has failed, removing it from the group" in text
    assert "reason=session timeout  since_last_heartbeat_ms=10004  session_timeout_ms=10000" in text
    # the join phase's bar starts at the root's and is 839/902 of it; the late member's wait starts near the end
    bars = {line.split("  ")[0].strip("│├└ "): line for line in text.splitlines()}
    root_bar = bars["rebalance"].rstrip()
    assert root_bar.endswith("█") and "+0 ms  902 ms" in root_bar


@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_every_line_fits_the_width(width: int) -> None:
    for r in rebalances().values():
        for line in to_text(render_rebalance(r, width)).splitlines():
            assert len(line) <= width, (width, line)
    for line in to_text(render_list(list(rebalances().values()), width)).splitlines():
        assert len(line) <= width, (width, line)


def test_at_80_columns_the_failed_line_is_wrapped_not_cut() -> None:
    text = to_text(render_rebalance(rebalances()[SESSION_TIMEOUT], 80))
    words = " ".join(line[10:].strip() for line in text.splitlines() if line.startswith(" " * 10) or "member failed"
                     in line)
    assert f"Member {FAILED_MEMBER} in group demo-0001 has failed, removing it from the group" in words


def test_members_that_never_rejoined_are_marked_in_error() -> None:
    text = to_text(render_rebalance(rebalances()[NEVER_JOINED], 120))
    never = [line for line in text.splitlines() if "(never joined, ✗)" in line]
    assert len(never) == 2
    assert text.count("member failed: Member ") == 2


def test_bars_scale_with_the_width() -> None:
    r = rebalances()[SESSION_TIMEOUT]
    for width in (80, 160):
        root_line = next(line for line in to_text(render_rebalance(r, width)).splitlines()
                         if line.startswith("rebalance "))
        assert len(root_line) == width  # the root spans the whole timeline: its bar reaches the last column


def test_colour_is_added_after_the_layout() -> None:
    lines = render_rebalance(rebalances()[SESSION_TIMEOUT], 80)
    coloured = to_text(lines, color=True)
    assert "\x1b[" in coloured
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == to_text(lines)


def test_list_has_one_line_per_rebalance_with_the_failed_member() -> None:
    lines = to_text(render_list(list(rebalances().values()), 120)).splitlines()
    assert len(lines) == 3
    assert SESSION_TIMEOUT in lines[1] and "session_timeout coordinator-simulate-5dda…" in lines[1]


def test_names_and_numbers() -> None:
    assert short_member(FAILED_MEMBER) == "coordinator-simulate-5dda…"
    assert short_member("static-1") == "static-1"
    assert [duration(us) for us in (0, 300, 902_000, 15_250_000)] == ["0 ms", "0.3 ms", "902 ms", "15.2 s"]


def test_not_jaeger_json_is_refused() -> None:
    with pytest.raises(TraceSourceError):
        rebalances_from_jaeger_json({"result": {}})


def args(**given: object) -> argparse.Namespace:
    defaults: dict[str, object] = dict(trace_id=None, jaeger_url=None, file=None, group=None, last=3, list=False,
                                       follow=False, service="coordinator", lookback="1h", width=100, color="never")
    return argparse.Namespace(**{**defaults, **given})


async def test_command_reads_a_saved_file_by_group_and_by_id() -> None:
    out = io.StringIO()
    assert await run_trace(args(file=CAPTURED, group="demo-0001", last=1), out) == 0  # the group's latest
    assert f"trace {NEVER_JOINED}" in out.getvalue() and SESSION_TIMEOUT not in out.getvalue()
    out = io.StringIO()
    assert await run_trace(args(file=CAPTURED, group="demo-0000", list=True), out) == 0
    assert out.getvalue().count("\n") == 1 and FIRST in out.getvalue()
    out = io.StringIO()
    assert await run_trace(args(file=CAPTURED, trace_id=NEVER_JOINED.upper()), out) == 0
    assert f"trace {NEVER_JOINED}" in out.getvalue()


async def test_command_says_where_jaeger_is_missing(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("COORDINATOR_JAEGER_URL", raising=False)
    monkeypatch.setenv("COORDINATOR_STATE_DIR", str(tmp_path))  # no running demo there
    assert await run_trace(args(), io.StringIO()) == 1
    assert "--jaeger-url" in capsys.readouterr().err
    from tests.support.ports import free_port

    assert await run_trace(args(jaeger_url=f"http://127.0.0.1:{free_port()}"), io.StringIO()) == 1
    assert "no Jaeger query API at" in capsys.readouterr().err


def consumer_group_trace() -> dict[str, object]:
    """A consumer group's (KIP-848) rebalance as Jaeger answers it: the root, the target, two members' moves."""
    def span(span_id: str, name: str, start_ms: int, took_ms: int, tags: dict[str, object],
             events: tuple[str, ...] = (), parent: str | None = "r") -> dict[str, object]:
        return {"spanID": span_id, "operationName": name, "startTime": 1_700_000_000_000_000 + start_ms * 1000,
                "duration": took_ms * 1000, "tags": [{"key": k, "value": v} for k, v in tags.items()],
                "logs": [{"timestamp": 1_700_000_000_000_000, "fields": [{"key": "event", "value": e}]}
                         for e in events],
                "references": [] if parent is None else [{"refType": "CHILD_OF", "traceID": "ab" * 16,
                                                          "spanID": parent}]}

    root = span("r", "rebalance", 0, 520, {
        "messaging.consumer.group.name": "orders", "coordinator.group.protocol": "consumer",
        "coordinator.group_epoch": 2, "coordinator.group_epoch.previous": 1, "coordinator.member_count": 2,
        "coordinator.rebalance.reason": "Member b joins the consumer group using the consumer protocol.",
        "coordinator.rebalance.reason_category": "member_joined", "coordinator.rebalance.outcome": "stable"},
        parent=None)
    return {"data": [{"traceID": "ab" * 16, "spans": [
        root, span("t", "target assignment", 0, 4, {}),
        span("a", "reconcile a", 4, 416, {"coordinator.member.id": "a"},
             ("revocation requested", "partitions revoked", "epoch reached")),
        span("b", "reconcile b", 4, 516, {"coordinator.member.id": "b"},
             ("waiting for partitions", "assignment delivered", "epoch reached"))]}]}


def test_a_consumer_group_rebalance_is_drawn_by_group_epoch_with_each_members_move() -> None:
    [rebalance] = rebalances_from_jaeger_json(consumer_group_trace())
    text = to_text(render_rebalance(rebalance, 100))
    assert "rebalance of orders  group epoch 1 → 2 · 520 ms · stable" in text
    assert "[member_joined]" in text and "target assignment" in text
    assert "reconcile a (revoked first, reached)" in text and "reconcile b (waited, reached)" in text
    [line] = to_text(render_list([rebalance], 120)).splitlines()
    assert "orders g2 520 ms member_joined" in line
