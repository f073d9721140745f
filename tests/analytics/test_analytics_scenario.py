"""The batch job over a scripted history produced through the real coordinator into real Kafka: three groups,
known joins, leaves, injected session expiries and a static replacement, each rebalance held open for a known
time; plus malformed records and a traced synthetic group written straight to the topic. Exact counts per group
and reason, durations against the scenario's timeline, skipped records by problem; then the report in Chromium."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from analytics import synthetic
from analytics.events import Source
from analytics.job import run_batch
from analytics.render import render
from coordinator.telemetry.event_schema import new_event
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from tests.support.service import describe, service, unique, until_loaded
from tests.support.wire import join, join_with_member_id, nested, request, sync

SHORT_SESSION_MS = 1_500  # the members whose session the scenario lets expire
LONG_SESSION_MS = 60_000
CLOCK_SLACK_MS = 20  # the coordinator's millisecond clock against ours
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
MALFORMED = {
    "not_json": [b"not json", b"[1, 2]"],
    "future_version": [b'{"version": 2, "type": "rebalance_started", "group_id": "g", "ts_ms": 1}'],
    "missing_field": [b'{"version": 1, "type": "rebalance_completed", "group_id": "g", "ts_ms": 1}'],
    "bad_type": [b'{"version": 1, "type": "rebalance_started", "group_id": "g", "ts_ms": 1, "generation": "x",'
                 b' "reason": "r"}'],
    "unknown_type": [b'{"version": 1, "type": "from_the_future", "group_id": "g", "ts_ms": 1}'],
    "no_version": [b'{"type": "member_left"}'],
}


@dataclass
class Member:
    client: KafkaClient
    member_id: str = ""
    instance_id: str | None = None
    session_timeout_ms: int = LONG_SESSION_MS
    last_request_at: float = 0.0  # monotonic, when its last join or sync went out: its session runs from later


@dataclass
class Timeline:
    """What the scenario did, to compare with what the job found."""

    held_ms: dict[str, list[int]] = field(default_factory=dict)  # group -> per rebalance, time it was held open
    # group -> per rebalance, how long the scenario took over it from before it could start until after it ended:
    # the coordinator's duration lies within, however long a loaded machine made it
    spent_ms: dict[str, list[int]] = field(default_factory=dict)
    reasons: dict[str, Counter[str]] = field(default_factory=dict)
    members: dict[str, Counter[str]] = field(default_factory=dict)  # group -> joined/left/failed/replaced

    def rebalance(self, group: str, reason: str, held_ms: int, since: float) -> None:
        self.held_ms.setdefault(group, []).append(held_ms)
        self.spent_ms.setdefault(group, []).append(int((time.monotonic() - since) * 1000) + 1)
        self.reasons.setdefault(group, Counter())[reason] += 1

    def member(self, group: str, kind: str) -> None:
        self.members.setdefault(group, Counter())[kind] += 1


class Scenario:
    def __init__(self, port: int, timeline: Timeline) -> None:
        self.port = port
        self.timeline = timeline
        self.clients: list[KafkaClient] = []

    async def connect(self, name: str) -> KafkaClient:
        client = await KafkaClient.connect("127.0.0.1", self.port, client_id=name, timeout_ms=30_000)
        self.clients.append(client)
        return client

    async def wait_state(self, client: KafkaClient, group: str, state: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while (await describe(client, group)).group_state != state:
            assert time.monotonic() < deadline, f"{group} never reached {state}"
            await asyncio.sleep(0.05)

    async def complete(self, group: str, members: list[Member], pending: dict[int, Any] | None = None) -> None:
        """Every member (re)joins (`pending` holds joins already sent, by index), then all sync."""
        pending = pending or {}

        async def rejoin(i: int, m: Member) -> Any:
            m.last_request_at = time.monotonic()
            if i in pending:
                return await pending[i]
            return await join(m.client, group, m.member_id, session_timeout_ms=m.session_timeout_ms,
                              group_instance_id=m.instance_id)

        joined = await asyncio.gather(*(rejoin(i, m) for i, m in enumerate(members)))
        assert [j.error_code for j in joined] == [0] * len(members), joined
        for m, j in zip(members, joined):
            m.member_id = j.member_id
        generation, leader = joined[0].generation_id, joined[0].leader
        plan = {m.member_id: b"assignment" for m in members}
        synced = await asyncio.gather(*(sync(m.client, group, generation, m.member_id,
                                             plan if m.member_id == leader else None) for m in members))
        assert [s.error_code for s in synced] == [0] * len(members), synced

    async def add(self, group: str, members: list[Member], new: Member, held_ms: int) -> None:
        """`new` joins; the others rejoin `held_ms` after the group started rebalancing."""
        since = time.monotonic()
        if new.instance_id is None:  # a dynamic member first gets MEMBER_ID_REQUIRED and its id
            first = await join(new.client, group, session_timeout_ms=new.session_timeout_ms)
            assert first.error_code == 79, first
            new.member_id = first.member_id
        # the join that adds the member is parked until the others have rejoined
        parked = asyncio.ensure_future(join(new.client, group, new.member_id, session_timeout_ms=new.session_timeout_ms,
                                            group_instance_id=new.instance_id))
        if members:
            await self.wait_state(members[0].client, group, "PreparingRebalance")
            await asyncio.sleep(held_ms / 1000)
        members.append(new)
        await self.complete(group, members, {len(members) - 1: parked})
        self.timeline.member(group, "joined")
        self.timeline.rebalance(group, "member_joined", held_ms if len(members) > 1 else 0, since)

    async def expire(self, group: str, members: list[Member], victim: Member, held_ms: int) -> None:
        """`victim` stops heartbeating; once the coordinator removed it, the others rejoin after `held_ms`."""
        since = victim.last_request_at  # its session (so the rebalance) may end before this is called
        members.remove(victim)
        observer = members[0].client if members else victim.client
        await self.wait_state(observer, group, "PreparingRebalance" if members else "Empty",
                              timeout_s=SHORT_SESSION_MS / 1000 + 60)
        if members:
            await asyncio.sleep(held_ms / 1000)
            await self.complete(group, members)
        self.timeline.member(group, "failed")
        self.timeline.rebalance(group, "session_timeout", held_ms if members else 0, since)

    async def leave(self, group: str, members: list[Member], leaver: Member, held_ms: int) -> None:
        since = time.monotonic()
        members.remove(leaver)
        entry = nested(ApiKey.LEAVE_GROUP, 5, "members")(member_id=leaver.member_id, group_instance_id=None,
                                                          reason="scenario leave")
        left = await leaver.client.request(request(ApiKey.LEAVE_GROUP, 5, group_id=group, members=(entry,)))
        assert left.error_code == 0, left
        if members:
            await self.wait_state(members[0].client, group, "PreparingRebalance")
            await asyncio.sleep(held_ms / 1000)
            await self.complete(group, members)
        self.timeline.member(group, "left")
        self.timeline.rebalance(group, "member_left", held_ms if members else 0, since)

    async def replace_static(self, group: str, members: list[Member], old: Member) -> None:
        """A new process with the same group.instance.id: the old member id is fenced, no rebalance."""
        new = Member(await self.connect(f"{group}-{old.instance_id}-restarted"), instance_id=old.instance_id)
        replaced = await join(new.client, group, session_timeout_ms=LONG_SESSION_MS, group_instance_id=old.instance_id)
        assert replaced.error_code == 0, replaced
        new.member_id = replaced.member_id
        members[members.index(old)] = new
        self.timeline.member(group, "replaced")


async def run_scenario(port: int) -> Timeline:
    timeline = Timeline()
    s = Scenario(port, timeline)
    try:
        first = await s.connect("probe")
        await until_loaded(first, "orders")

        async def orders() -> None:
            members: list[Member] = []
            m1, m2 = Member(await s.connect("orders-1")), Member(await s.connect("orders-2"))
            m3 = Member(await s.connect("orders-3"), session_timeout_ms=SHORT_SESSION_MS)
            await s.add("orders", members, m1, 0)
            await s.add("orders", members, m2, 700)
            await s.add("orders", members, m3, 400)
            await s.expire("orders", members, m3, 1_200)
            await s.leave("orders", members, m2, 900)
            await s.leave("orders", members, m1, 0)

        async def payments() -> None:
            members: list[Member] = []
            s1 = Member(await s.connect("payments-1"), instance_id="payments-instance-1")
            s2 = Member(await s.connect("payments-2"), instance_id="payments-instance-2",
                        session_timeout_ms=SHORT_SESSION_MS)
            await s.add("payments", members, s1, 0)
            await s.replace_static("payments", members, s1)
            await s.add("payments", members, s2, 500)
            await s.expire("payments", members, s2, 800)

        async def audit() -> None:
            members: list[Member] = []
            a1 = Member(await s.connect("audit-1"), session_timeout_ms=SHORT_SESSION_MS)
            await s.add("audit", members, a1, 0)
            await s.expire("audit", members, a1, 0)

        await asyncio.gather(orders(), payments(), audit())
    finally:
        for client in s.clients:
            await client.close()
    return timeline


@pytest.fixture(scope="module")
def scenario(kafka_bootstrap: str, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    topic = unique("__events-analytics")
    settings = ("group.initial.rebalance.delay.ms=0", "group.min.session.timeout.ms=1000")

    async def produce() -> Timeline:
        async with service(kafka_bootstrap, unique("__state"), *settings, event_topic=topic) as running:
            timeline = await run_scenario(running.port)
            assert await running.terminate() == 0  # flushes the event producer
        return timeline

    timeline = asyncio.run(produce())
    malformed = [value for values in MALFORMED.values() for value in values]
    now = int(time.time() * 1000)
    traced = [("traced", new_event("rebalance_started", "traced", now, generation=0, reason="Adding new member x",
                                   trace_id=TRACE_ID)),
              ("traced", new_event("rebalance_completed", "traced", now + 5, generation=1, member_count=1,
                                   duration_ms=5, trace_id=TRACE_ID))]
    synthetic.write(kafka_bootstrap, topic, iter(traced), malformed)
    raw = read_raw(kafka_bootstrap, topic)
    out = tmp_path_factory.mktemp("analytics-out")
    result = run_batch(spark, Source(kafka_bootstrap, topic), out)
    return {"timeline": timeline, "result": result, "raw": raw, "out": out, "spark": spark, "traced_ms": now,
            "source": Source(kafka_bootstrap, topic)}


def read_raw(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """The valid events as the coordinator wrote them, read back with a plain consumer (for exact comparisons)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("raw"), "enable.auto.commit": False})
    events = []
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        partitions = [TopicPartition(topic, p, 0) for p in metadata.partitions]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=30)[1] for p in partitions}
        consumer.assign(partitions)
        remaining = {p: end for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + 60
        while remaining and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            if message.offset() + 1 >= remaining.get(message.partition(), 0):
                remaining.pop(message.partition(), None)
            try:
                event = json.loads(message.value())
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("version") == 1 and event.get("group_id") in (
                    "orders", "payments", "audit"):
                events.append(event)
        assert not remaining, remaining
    finally:
        consumer.close()
    return events


def table(scenario: dict[str, Any], name: str) -> list[dict[str, Any]]:
    frame = scenario["spark"].read.parquet(str(Path(scenario["out"]) / name))
    return [row.asDict(recursive=True) for row in frame.collect()]


def test_counts_per_group_and_reason_are_exact(scenario: dict[str, Any]) -> None:
    timeline: Timeline = scenario["timeline"]
    result = scenario["result"]
    for group in ("orders", "payments", "audit"):
        row = result.group(group)
        expected = timeline.members[group]
        assert (row["joined"], row["left"], row["failed"], row["replaced"]) == (
            expected["joined"], expected["left"], expected["failed"], expected["replaced"]), row
        assert row["rebalances"] == sum(timeline.reasons[group].values()), row
        assert row["completed_rebalances"] == len(timeline.held_ms[group]), row
    reasons = {(r["group_id"], r["reason_category"]): r["rebalances"] for r in table(scenario, "reasons")}
    expected_reasons = {(g, reason): n for g, counter in timeline.reasons.items() for reason, n in counter.items()}
    expected_reasons[("traced", "member_joined")] = 1
    assert {k: v for k, v in reasons.items() if k[0] != "*"} == expected_reasons
    overall = result.overall()
    assert (overall["joined"], overall["left"], overall["failed"], overall["replaced"]) == (6, 2, 3, 1)
    assert overall["rebalances"] == 11 + 1
    failures = {(r["group_id"], r["client_id"], r["group_instance_id"]): r["failures"]
                for r in table(scenario, "failing_members")}
    # the static member is named by its instance id; its client id is the one it joined with
    assert failures == {("orders", "orders-3", None): 1, ("payments", "payments-2", "payments-instance-2"): 1,
                        ("audit", "audit-1", None): 1}


def test_durations_match_the_timeline(scenario: dict[str, Any]) -> None:
    timeline: Timeline = scenario["timeline"]
    rows = table(scenario, "rebalances")
    raw_durations: dict[str, list[int]] = {}
    for event in scenario["raw"]:
        if event["type"] == "rebalance_completed":
            raw_durations.setdefault(event["group_id"], []).append(event["duration_ms"])
    for group, held in timeline.held_ms.items():
        spent = timeline.spent_ms[group]
        episodes = sorted((r for r in rows if r["group_id"] == group), key=lambda r: r["episode"])
        assert [r["status"] for r in episodes] == ["completed"] * len(held), episodes
        durations = [r["duration_ms"] for r in episodes]
        assert durations == raw_durations[group]  # the coordinator's own figures, carried over exactly
        for duration, held_ms, spent_ms in zip(durations, held, spent):
            assert held_ms <= duration <= spent_ms + CLOCK_SLACK_MS, (group, durations, held, spent)
        summary = scenario["result"].group(group)
        assert summary["duration_max_ms"] == max(durations)
        assert min(durations) <= summary["duration_p50_ms"] <= summary["duration_p95_ms"] <= max(durations)
        # time spent rebalancing, from state changes (wall clock), agrees with the coordinator's durations
        assert abs(summary["rebalancing_ms"] - sum(durations)) <= 60 * len(durations), summary
        assert 0 < summary["rebalancing_share"] < 1
    traced = [r for r in rows if r["group_id"] == "traced"]
    assert [(r["trace_id"], r["duration_ms"], r["reason_category"]) for r in traced] == [(TRACE_ID, 5, "member_joined")]


def test_malformed_records_are_counted_and_skipped(scenario: dict[str, Any]) -> None:
    expected = {problem: len(values) for problem, values in MALFORMED.items()}
    assert scenario["result"].skipped == expected
    assert {r["problem"]: r["records"] for r in table(scenario, "skipped")} == expected
    summary = json.loads((Path(scenario["out"]) / "summary.json").read_text())
    assert summary["skipped"] == expected
    valid = len(scenario["raw"]) + 2  # the coordinator's events and the traced group's two
    assert scenario["result"].events == valid


def test_report_renders_its_plots_in_chromium(scenario: dict[str, Any]) -> None:
    """The scenario's report in headless Chromium: the three plots drawn with their bars, the tables filled,
    no script or console error, nothing fetched from elsewhere, and a screenshot of the whole page."""
    rendered = render(Path(scenario["out"]) / "report.html")
    assert rendered.errors == []
    page = rendered.page
    assert page["external"] == [] and page["scripts"] == 0, page  # self-contained
    assert {p["name"] for p in page["plots"]} == {"rebalances-over-time", "duration-distribution",
                                                  "failures-by-member"}
    for plot in page["plots"]:
        assert plot["width"] > 400 and plot["height"] > 100 and not plot["empty"], plot
    assert rendered.plot("failures-by-member")["bars"] == 3  # one per failing member
    completed = sum(len(held) for held in scenario["timeline"].held_ms.values()) + 1
    histogram = table(scenario, "duration_histogram")
    assert sum(r["rebalances"] for r in histogram if r["group_id"] == "*") == completed
    assert rendered.plot("duration-distribution")["bars"] == sum(1 for r in histogram if r["group_id"] == "*")
    assert rendered.plot("rebalances-over-time")["bars"] >= 4  # four groups rebalanced
    tables = {t["name"]: t["rows"] for t in page["tables"]}
    assert tables["group-summary"] == 1 + 4 and tables["skipped"] == len(MALFORMED), tables
    assert rendered.screenshot.startswith(b"\x89PNG") and len(rendered.screenshot) > 20_000
    (Path(scenario["out"]) / "report.png").write_bytes(rendered.screenshot)


def test_since_and_until_select_events_by_their_time(scenario: dict[str, Any], tmp_path: Path) -> None:
    """Only the traced group's two events lie in [traced_ms, traced_ms + 1 s): the coordinator's events are
    older (read through the pushdown's margin, then filtered out exactly)."""
    source = scenario["source"]
    since = scenario["traced_ms"]
    ranged = Source(source.bootstrap, source.topic, since_ms=since, until_ms=since + 1_000)
    result = run_batch(scenario["spark"], ranged, tmp_path)
    assert result.events == 2
    assert [row["group_id"] for row in result.summary] == ["*", "traced"]
    assert (result.time_range.start_ms, result.time_range.end_ms) == (since, since + 1_000)
    assert result.group("traced")["rebalances"] == 1 and result.group("traced")["duration_max_ms"] == 5
