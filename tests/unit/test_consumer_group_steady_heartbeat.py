"""The steady-state shortcut of ConsumerGroupHeartbeat (heartbeat.steady_heartbeat) answers exactly as the full path:
generated histories of joins, heartbeats with changed or repeated fields, acknowledgements, leaves, clock advances,
partition count changes and changes of the group's own configuration run against two runtimes, one with the shortcut
and one without; every answer, every record written, the groups' state and the members' timers are the same after
every step. On the shortcut's side a heartbeat in the steady wire shape (every field after the epoch null) is
offered first to the connection's steady path (handlers/consumer_group_heartbeat.py's steady_frame: a member's
answer kept and given again, or GroupRuntime.steady_consumer_group_heartbeat), as the server does; its answer is the
full path's answer byte for byte."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse, steady_heartbeat
from coordinator.server.context import ConnectionContext, Node
from coordinator.server.handlers import consumer_group_heartbeat
from coordinator.topics import StaticTopics, TopicImage
from protocol import apis, codec
from protocol.apis import ApiKey
from protocol.codec import RequestHeader
from protocol.messages import build
from tests.support.consumer_group_env import FOO, GROUP, Env

MEMBERS = ("m0", "m1", "m2")
INSTANCES = {"m0": "i-m0"}  # m0 is static

heartbeats = st.tuples(
    st.just("heartbeat"),
    st.sampled_from(MEMBERS),
    st.sampled_from(["current"] * 8 + ["previous", "ahead", "join", "leave", "leave_static"]),
    st.sampled_from([None] * 5 + ["same", ("foo",), ("foo", "bar")]),
    st.sampled_from([None] * 3 + ["assigned", "assigned", "nothing"]),
    st.sampled_from([-1] * 4 + [30_000, 20_000]),
    st.sampled_from([None] * 4 + ["r1"]),
    st.sampled_from(["own"] * 6 + ["other"]),
    st.sampled_from([None] * 4 + ["uniform", "range"]),
)
ACTIONS = st.one_of(heartbeats,
                    st.tuples(st.just("advance"), st.sampled_from([100, 2_000, 6_000, 46_000])),
                    st.tuples(st.just("partitions"), st.sampled_from([1, 2])),  # more: Kafka never has fewer
                    # the group's own session timeout and heartbeat interval, set on the cluster (group_configs.py)
                    st.tuples(st.just("config"), st.sampled_from([{}, {"consumer.heartbeat.interval.ms": "7000"},
                                                                  {"consumer.session.timeout.ms": "50000"}])))


class _Timers:
    """What steady_heartbeat asks of the timers, written down (a preview on a copy of the group)."""

    def schedule_session(self, group_id: str, member_id: str) -> None: ...
    def schedule_rebalance(self, group_id: str, member_id: str, member_epoch: int, timeout_ms: int) -> None: ...
    def cancel_rebalance(self, group_id: str, member_id: str) -> None: ...
    def cancel_all(self, group_id: str, member_id: str) -> None: ...


def _request(env: Env, action: tuple[Any, ...]) -> HeartbeatRequest:
    _kind, member_id, epoch_kind, names, owned_kind, rebalance_ms, rack, client, assignor = action
    group = env.group()
    member = group.members.get(member_id) if group is not None else None
    epoch = member.member_epoch if member is not None else 0
    epoch = {"current": epoch, "previous": member.previous_member_epoch if member is not None else 0,
             "ahead": epoch + 1, "join": 0, "leave": -1, "leave_static": -2}[epoch_kind]
    if names == "same":
        names = member.subscribed_topic_names if member is not None else ("foo",)
    owned: list[tuple[uuid.UUID, tuple[int, ...]]] | None = None
    if owned_kind == "assigned" and member is not None:
        owned = list(member.assigned.items())
    elif owned_kind == "nothing":
        owned = []
    if epoch == 0:  # a join as a client sends it
        names, owned, rebalance_ms = names or ("foo",), [], 30_000 if rebalance_ms == -1 else rebalance_ms
    instance_id = INSTANCES.get(member_id)
    return HeartbeatRequest(GROUP, member_id, epoch, instance_id=instance_id, rack_id=rack,
                            rebalance_timeout_ms=rebalance_ms, subscribed_topic_names=names,
                            server_assignor=assignor, owned=owned,
                            client_id=member_id if client == "own" else "other", client_host="/127.0.0.1")


def _state(group: ConsumerGroup | None) -> object:
    if group is None:
        return None
    return (group.group_epoch, group.metadata_hash, group.assignment_epoch, group.members, group.static_members,
            group.targets, group._partition_epochs, group.resolved_regexes, group.metadata_refresh_deadline_ms,
            group.state)


def _timers(env: Env) -> dict[tuple[str, str, str], int | None]:
    service = env.runtime.consumer_groups
    return {key: getattr(task, "deadline_ms", task.expiration_ms) for key, task in service._timers.items()
            if task.is_scheduled}


def _answer(response: HeartbeatResponse) -> tuple[object, ...]:
    return (response.error, response.message, response.member_id, response.member_epoch,
            response.heartbeat_interval_ms, response.assignment)


def _wire_steady(request: HeartbeatRequest) -> bool:
    """The request as protocol.consumer_group_heartbeat reads it: every field after the epoch null."""
    return (request.instance_id, request.rack_id, request.subscribed_topic_names, request.subscribed_topic_regex,
            request.server_assignor, request.owned) == (None,) * 6 and request.rebalance_timeout_ms == -1


def _frame(request: HeartbeatRequest) -> bytes:
    """The request in the steady wire shape, as a v1 client sends it (without its size)."""
    body = build(apis.request_class(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1), group_id=request.group_id,
                 member_id=request.member_id, member_epoch=request.member_epoch, instance_id=None, rack_id=None,
                 rebalance_timeout=datetime.timedelta(milliseconds=-1), subscribed_topic_names=None,
                 subscribed_topic_regex=None, server_assignor=None, topic_partitions=None)
    return codec.encode_request(7, request.client_id, body)[4:]


async def _history(actions: list[tuple[Any, ...]]) -> int:
    """Runs the actions on both runtimes; returns how many heartbeats the shortcut answered (and the ones
    `steady_consumer_group_heartbeat` answered, in `_history.wire_steady`)."""
    shortcut, full = Env(), Env()
    full.runtime.consumer_groups.steady_shortcut = False
    group_config: dict[str, str] = {}

    async def describe(group_ids: list[str]) -> dict[str, dict[str, str]]:
        return {group_id: dict(group_config) for group_id in group_ids}

    for env in (shortcut, full):
        env.runtime.consumer_groups.group_configs.describe = describe
    steady = wire_steady = 0
    ctx = ConnectionContext(Node(0, "127.0.0.1", 9092, "test"), shortcut.runtime, "/127.0.0.1", "test")
    try:
        for action in actions:
            if action[0] == "config":
                group_config.clear()
                group_config.update(action[1])
                for env in (shortcut, full):
                    env.runtime.consumer_groups.group_configs.invalidate([GROUP])
                for _ in range(5):  # the reads are done
                    await asyncio.sleep(0)
            elif action[0] == "advance":
                for env in (shortcut, full):
                    env.advance(action[1])
            elif action[0] == "partitions":
                for env in (shortcut, full):
                    foo = env.topics.by_name("foo")
                    assert foo is not None
                    env.topics.put(TopicImage(FOO, "foo", foo.partitions + action[1]))
            else:
                request = _request(shortcut, action)
                assert request == _request(full, action)
                group = shortcut.group()
                if group is not None and steady_heartbeat(
                        group.snapshot(), request, shortcut.topics, shortcut.runtime.consumer_groups.settings,
                        _Timers(), shortcut.clock.now_ms()) is not None:
                    steady += 1
                hits = ctx.steady_answers.hits if ctx.steady_answers is not None else 0
                answered = consumer_group_heartbeat.steady_frame(ctx, _frame(request)) if _wire_steady(
                    request) else None
                if answered is not None:  # the connection's steady path: the full path's bytes
                    wire_steady += 1
                    header = RequestHeader(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, 7, request.client_id)
                    assert answered == consumer_group_heartbeat.to_frame(
                        header, await full.runtime.consumer_group_heartbeat(request)), (action, request)
                else:
                    assert ctx.steady_answers is None or ctx.steady_answers.hits == hits
                    answers = [await shortcut.runtime.consumer_group_heartbeat(request),
                               await full.runtime.consumer_group_heartbeat(request)]
                    assert _answer(answers[0]) == _answer(answers[1]), (action, request)
            for _ in range(3):  # what the fences of a clock advance wrote is acknowledged
                await asyncio.sleep(0)
            assert _state(shortcut.group()) == _state(full.group()), action
            assert shortcut.store.consumer_records == full.store.consumer_records, action
            assert _timers(shortcut) == _timers(full), action
    finally:
        for env in (shortcut, full):
            await env.runtime.shutdown()
            await env.timer.close()
    _history.wire_steady = wire_steady  # type: ignore[attr-defined]
    _history.answered_again = ctx.steady_answers.hits if ctx.steady_answers is not None else 0  # type: ignore
    return steady


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ACTIONS, max_size=30))
def test_the_shortcut_answers_as_the_full_path(actions: list[tuple[Any, ...]]) -> None:
    asyncio.run(_history(actions))


def test_a_stable_groups_heartbeats_take_the_shortcut_and_topic_news_does_not() -> None:
    """The histories above reach the shortcut: a stable group's plain heartbeats, also after the metadata
    refresh interval; a partition count change is not one (the full path bumps the epoch)."""
    join = ("heartbeat", "m1", "join", None, None, -1, None, "own", None)
    plain = ("heartbeat", "m1", "current", None, None, -1, None, "own", None)
    repeated = ("heartbeat", "m1", "current", "same", "assigned", 30_000, None, "own", None)
    assert asyncio.run(_history([join, plain, plain, repeated, ("advance", 6_000), plain])) == 4
    assert _history.wire_steady == 3  # type: ignore[attr-defined]  # the plain ones, also after the interval
    # the second (the first's answer again) and the one after the interval (the topics looked at again there)
    assert _history.answered_again == 2  # type: ignore[attr-defined]
    assert asyncio.run(_history([join, plain, ("partitions", 2), ("advance", 6_000), plain])) == 1


def test_the_groups_own_configuration_reaches_the_shortcut_as_the_full_path() -> None:
    """A group's own heartbeat interval and session timeout (set on the cluster) answered and armed alike: the
    member outlives the coordinator's 45 s session under the group's 50 s."""
    join = ("heartbeat", "m1", "join", None, None, -1, None, "own", None)
    plain = ("heartbeat", "m1", "current", None, None, -1, None, "own", None)
    interval = ("config", {"consumer.heartbeat.interval.ms": "7000"})
    session = ("config", {"consumer.session.timeout.ms": "50000"})
    assert asyncio.run(_history([interval, join, plain, plain, session, plain, ("advance", 46_000), plain])) == 4
