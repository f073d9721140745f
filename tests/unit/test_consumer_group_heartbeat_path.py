"""ConsumerGroupHeartbeat's synchronous path: the steady heartbeat answered without a coroutine, a known topic
refreshed in the background while an unknown one is learnt before the answer, and the group's topic names read
without copies agreeing with the counted ones."""

from __future__ import annotations

import asyncio
import logging
import uuid
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.runtime import _some_names
from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
from coordinator.group.modern.records import MemberMetadataRecord, RegexRecord, Tombstone, RecordType
from coordinator.relay.cluster import ClusterMetadata
from protocol.error_codes import Errors
from protocol.apis import ApiKey
from tests.support.consumer_group_env import FOO, GROUP, Env
from tests.support.polling import wait_until
from tests.support.server import RunningServer
from tests.support.service_front import ServiceFront
from tests.support.wire import ms, request

BAR_ID = uuid.UUID(int=0xBA2)


async def test_a_steady_heartbeat_is_answered_without_a_coroutine() -> None:
    env = Env()
    try:
        joined = await env.heartbeat("a", 0)
        answer = env.runtime.start_consumer_group_heartbeat(
            HeartbeatRequest(GROUP, "a", joined.member_epoch, client_id="a", client_host="/127.0.0.1"))
        assert type(answer) is HeartbeatResponse
        assert (answer.error, answer.member_epoch, answer.assignment) == (Errors.NONE, 1, None)
    finally:
        await env.runtime.shutdown()
        await env.timer.close()


def _metadata(partitions: dict[str, int]) -> SimpleNamespace:
    ids = {"foo": FOO, "bar": BAR_ID}
    return SimpleNamespace(topics=[SimpleNamespace(name=name, error_code=0, partitions=list(range(count)),
                                                   topic_id=ids[name]) for name, count in partitions.items()])


async def test_a_known_topic_is_refreshed_in_the_background_and_an_unknown_one_before_the_answer() -> None:
    env = Env()
    cluster_partitions = {"foo": 6, "bar": 3}
    asked: list[list[str]] = []
    gate = asyncio.Event()

    async def refresh(topics: list[str]) -> SimpleNamespace:
        asked.append(topics)
        await gate.wait()
        return _metadata({t: cluster_partitions[t] for t in topics})

    cluster = ClusterMetadata(refresh, min_interval_ms=0)
    cluster.observe(_metadata({"foo": 6}), all_topics=False)  # foo known, never refreshed; bar unknown
    env.runtime.consumer_groups.topics = cluster
    env.runtime.refresh_topics = lambda names: cluster.refresh(names, 5_000)
    env.runtime.stale_topics = lambda names: cluster.stale(names, 5_000)
    try:
        cluster_partitions["foo"] = 8  # the cluster gained partitions the view has not seen yet
        join = HeartbeatRequest(GROUP, "a", 0, rebalance_timeout_ms=30_000, subscribed_topic_names=("foo",),
                                owned=[], client_id="a", client_host="/127.0.0.1")
        started = env.runtime.start_consumer_group_heartbeat(join)
        await asyncio.sleep(0)  # the refresh's task starts
        assert asked == [["foo"]]
        # answered (once its records are written) with what the view has, the refresh still under way
        answer = await asyncio.wait_for(started, 5)  # type: ignore[arg-type]
        assert answer.assignment == {FOO: (0, 1, 2, 3, 4, 5)} and not gate.is_set()
        steady = HeartbeatRequest(GROUP, "a", 1, client_id="a", client_host="/127.0.0.1")
        assert type(env.runtime.start_consumer_group_heartbeat(steady)) is HeartbeatResponse
        assert asked == [["foo"]]  # one refresh in flight per topic
        gate.set()
        for _ in range(20):
            await asyncio.sleep(0)
        assert cluster.partition_count("foo") == 8
        env.advance(5_000)  # the group looks at its topics again once per heartbeat interval
        grown = env.runtime.start_consumer_group_heartbeat(
            HeartbeatRequest(GROUP, "a", 1, owned=[(FOO, (0, 1, 2, 3, 4, 5))], client_id="a",
                             client_host="/127.0.0.1"))
        assert type(grown) is not HeartbeatResponse  # the epoch bump is written before the answer
        grown = await grown  # type: ignore[misc]
        assert (grown.member_epoch, grown.assignment) == (2, {FOO: tuple(range(8))})
        # a topic the view does not know is learnt before the answer, so the join's target has it
        other = env.runtime.start_consumer_group_heartbeat(
            HeartbeatRequest(GROUP, "b", 0, rebalance_timeout_ms=30_000, subscribed_topic_names=("bar",), owned=[],
                             client_id="b", client_host="/127.0.0.1"))
        assert type(other) is not HeartbeatResponse
        assert (await other).assignment == {BAR_ID: (0, 1, 2)}  # type: ignore[misc]
        assert asked[-1] == ["bar"]
    finally:
        gate.set()
        await env.runtime.shutdown()
        await env.timer.close()


async def test_a_failed_refresh_logs_its_topics_and_the_group_only_when_one_waits_for_it(
        caplog: pytest.LogCaptureFixture) -> None:
    env = Env()

    async def unreachable(topics: list[str]) -> SimpleNamespace:
        raise ConnectionError("cluster unreachable")

    cluster = ClusterMetadata(unreachable, min_interval_ms=0)
    cluster.observe(_metadata({"foo": 6}), all_topics=False)  # foo known, never refreshed; bar unknown
    env.runtime.consumer_groups.topics = cluster
    env.runtime.refresh_topics = lambda names: cluster.refresh(names, 5_000)
    env.runtime.stale_topics = lambda names: cluster.stale(names, 5_000)
    caplog.set_level(logging.WARNING, logger="coordinator.group")
    try:
        started = env.runtime.start_consumer_group_heartbeat(
            HeartbeatRequest(GROUP, "a", 0, rebalance_timeout_ms=30_000, subscribed_topic_names=("foo",), owned=[],
                             client_id="a", client_host="/127.0.0.1"))
        await asyncio.wait_for(started, 5)  # type: ignore[arg-type]
        await wait_until(lambda: "topic_refresh_failed" in caplog.text, 5, "the background refresh's log line")
        [background] = [r.getMessage() for r in caplog.records if "topic_refresh_failed" in r.getMessage()]
        assert "background=true topics=1 names=foo " in background and "group=" not in background
        caplog.clear()
        waiting = env.runtime.start_consumer_group_heartbeat(
            HeartbeatRequest(GROUP, "b", 0, rebalance_timeout_ms=30_000, subscribed_topic_names=("bar", "foo"),
                             owned=[], client_id="b", client_host="/127.0.0.1"))
        await asyncio.wait_for(waiting, 5)  # type: ignore[arg-type]
        [foreground] = [r.getMessage() for r in caplog.records if "topic_refresh_failed" in r.getMessage()]
        assert f"group={GROUP} topics=2 names=bar,foo " in foreground and "background" not in foreground
    finally:
        await env.runtime.shutdown()
        await env.timer.close()


def test_a_long_topic_list_is_cut_in_the_log_line() -> None:
    names = [f"t{n}" for n in range(25)]
    assert _some_names(names) == ",".join(names[:10]) + ",...(+15)"
    assert _some_names(names[:10]) == ",".join(names[:10])


_NAMES = st.sampled_from(["a", "b", "c", "d"])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.frozensets(_NAMES, max_size=3),
                          st.sampled_from([None, "r1", "r2"]), st.booleans()), max_size=25))
def test_the_group_topic_names_agree_with_the_counted_subscriptions(
        steps: list[tuple[int, frozenset[str], str | None, bool]]) -> None:
    group = ConsumerGroup("g")
    group.replay(RegexRecord("g", "r1", ("c", "e"), 1, 0))
    group.replay(RegexRecord("g", "r2", (), 1, 0))
    for member, names, regex, leaves in steps:
        member_id = f"m{member}"
        if leaves:
            group.replay(Tombstone(RecordType.MEMBER_METADATA, "g", member_id))
        else:
            group.replay(MemberMetadataRecord("g", member_id, None, None, "c", "h", tuple(sorted(names)), regex,
                                              30_000, None))
        assert set(group.topic_names()) == set(group.subscribed_topic_names())


async def test_the_steady_path_leaves_to_the_general_one_what_must_wait() -> None:
    """GroupRuntime.steady_consumer_group_heartbeat answers a plain heartbeat at once, but not while its group has
    a write not yet acknowledged (the answer goes out after it), nor for a member that is not steady."""
    env = Env()
    try:
        a = await env.heartbeat("a", 0)
        await env.heartbeat("a", a.member_epoch, owned=dict(a.assignment or {}))
        plain = HeartbeatRequest(GROUP, "a", a.member_epoch, client_id="a", client_host="/127.0.0.1")
        answer = env.runtime.steady_consumer_group_heartbeat(plain)
        assert answer is not None and (answer.error, answer.member_epoch, answer.assignment) == (Errors.NONE, 1, None)
        gate = env.store.hold_next_write()
        racked = env.runtime.start_consumer_group_heartbeat(HeartbeatRequest(
            GROUP, "a", a.member_epoch, rack_id="r1", client_id="a", client_host="/127.0.0.1"))
        assert type(racked) is not HeartbeatResponse  # the member's new rack is being written
        assert env.runtime.steady_consumer_group_heartbeat(plain) is None
        waiting = env.runtime.start_consumer_group_heartbeat(plain)
        assert type(waiting) is not HeartbeatResponse  # answered once the rack's write is acknowledged
        gate.set()
        await racked  # type: ignore[misc]
        assert (await waiting).member_epoch == 1  # type: ignore[misc]
        assert env.runtime.steady_consumer_group_heartbeat(plain) is not None
        other_client = HeartbeatRequest(GROUP, "a", a.member_epoch, client_id="b", client_host="/127.0.0.1")
        assert env.runtime.steady_consumer_group_heartbeat(other_client) is None  # its client id is written
    finally:
        await env.runtime.shutdown()
        await env.timer.close()


async def test_the_steady_path_answers_on_the_wire_as_the_general_one() -> None:
    """A steady heartbeat's answer from its frame (the connection's steady path) and from the general path (the
    runtime's steady path switched off) are the same response."""
    async with RunningServer(front=ServiceFront) as env:
        client = await env.client()
        base = dict(group_id="cg", member_id="m-1", instance_id=None, rack_id=None, subscribed_topic_regex=None,
                    server_assignor=None)
        joined = await client.request(request(
            ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, member_epoch=0, rebalance_timeout=ms(30_000),
            subscribed_topic_names=("t",), topic_partitions=(), **base))
        steady = request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, member_epoch=joined.member_epoch,
                         rebalance_timeout=ms(-1), subscribed_topic_names=None, topic_partitions=None, **base)
        answers = [await client.request(steady)]
        env.service.steady_consumer_group_heartbeat = lambda _req: None  # the front's: the general path serves it
        answers.append(await client.request(steady))
        del env.service.steady_consumer_group_heartbeat  # the runtime's again
        assert answers[0] == answers[1]
        assert (answers[0].error_code, answers[0].member_id, answers[0].member_epoch, answers[0].assignment) == (
            0, "m-1", joined.member_epoch, None)


async def test_a_written_heartbeats_answer_is_ready_as_its_write_is_acknowledged() -> None:
    """The answer of a heartbeat that wrote resolves in the write's own callback: no loop turns between the
    store's acknowledgement and the answer (a reconciliation waits for one per member)."""
    env = Env()
    try:
        gate = env.store.hold_next_write()
        joining = env.runtime.start_consumer_group_heartbeat(HeartbeatRequest(
            GROUP, "a", 0, rebalance_timeout_ms=30_000, subscribed_topic_names=("foo",), owned=[], client_id="a",
            client_host="/127.0.0.1"))
        assert isinstance(joining, asyncio.Future)
        for _ in range(3):
            await asyncio.sleep(0)
        assert not joining.done()
        gate.set()
        turns = 0
        while not joining.done():
            await asyncio.sleep(0)
            turns += 1
        assert turns <= 2, turns  # the store's own: its held append resumes, then its Task ends
        assert joining.result().member_epoch == 1
    finally:
        await env.runtime.shutdown()
        await env.timer.close()
