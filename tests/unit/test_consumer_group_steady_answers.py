"""A member's steady ConsumerGroupHeartbeat answered again from what its last steady answer came from
(handlers/consumer_group_heartbeat.py's SteadyAnswers, coordinator/group/modern/steady.py): taken for the same
request bytes while nothing changed, with the general path's bytes; not taken once the member's fields changed, its
epoch is behind, the group's epoch is ahead, its session ended, the group's configuration changed, a write is not
acknowledged or the subscribed topics changed when looked at again (as the shortcut looks, at the refresh deadline).
The session deadline it moves is the one the general path moves."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator

import pytest

from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
from coordinator.server.context import ConnectionContext, Node
from coordinator.server.handlers import consumer_group_heartbeat
from protocol import apis, codec
from protocol.apis import ApiKey
from protocol.error_codes import Errors
from protocol.messages import build
from coordinator.topics import TopicImage
from tests.support.consumer_group_env import FOO, GROUP, SESSION_MS, Env


def steady_request(member_id: str, epoch: int, client_id: str | None = None, *, version: int = 1,
                   correlation_id: int = 7) -> bytes:
    """The frame (without its size) a client sends between changes: member id and epoch, every other field null."""
    cls = apis.request_class(ApiKey.CONSUMER_GROUP_HEARTBEAT, version)
    fields = dict(group_id=GROUP, member_id=member_id, member_epoch=epoch, instance_id=None, rack_id=None,
                  rebalance_timeout=datetime.timedelta(milliseconds=-1), subscribed_topic_names=None,
                  server_assignor=None, topic_partitions=None)
    if version >= 1:
        fields["subscribed_topic_regex"] = None
    return codec.encode_request(correlation_id, member_id if client_id is None else client_id,
                                build(cls, **fields))[4:]


class Served:
    """One connection's context over the runtime of `env`: the steady path as the connection runs it, and the
    general path (decoder, handler, runtime) for comparison."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.ctx = ConnectionContext(Node(0, "127.0.0.1", 9092, "test"), env.runtime, "/127.0.0.1", "test")

    @property
    def hits(self) -> int:
        answers = self.ctx.steady_answers
        return 0 if answers is None else answers.hits

    def steady(self, frame: bytes) -> bytes | None:
        return consumer_group_heartbeat.steady_frame(self.ctx, frame)

    async def general(self, frame: bytes, *, shortcut: bool = False) -> bytes:
        """The answer of the connection's general path (the group logic's steady shortcut off unless `shortcut`)."""
        service = self.env.runtime.consumer_groups
        service.steady_shortcut = shortcut
        try:
            request = codec.decode_request(frame)
            ctx = ConnectionContext(self.ctx.node, self.env.runtime, self.ctx.client_host, "general")
            return await consumer_group_heartbeat.handle(ctx, request.header, request.body)
        finally:
            service.steady_shortcut = True

    async def served(self, frame: bytes) -> bytes:
        """As the connection serves it: the steady path, else the general one."""
        answer = self.steady(frame)
        return answer if answer is not None else await self.general(frame, shortcut=True)


def error_of(answer: bytes) -> tuple[Errors, int]:
    _correlation_id, body = codec.decode_response(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, answer[4:])
    return Errors(body.error_code), int(body.member_epoch)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    environment = Env()
    try:
        yield environment
    finally:
        await environment.close()


async def _stable(env: Env, *member_ids: str) -> dict[str, int]:
    """The members joined and acknowledged what they were given until nothing changed: their epochs."""
    owned: dict[str, dict] = {}
    epochs = {member_id: 0 for member_id in member_ids or ("a",)}
    for _ in range(10):
        changed = False
        for member_id, epoch in epochs.items():
            answer = await env.heartbeat(member_id, epoch, owned=owned.get(member_id) if epoch else None)
            assert answer.error == Errors.NONE, answer
            if answer.assignment is not None and dict(answer.assignment) != owned.get(member_id):
                owned[member_id], changed = dict(answer.assignment), True
            changed = changed or answer.member_epoch != epoch
            epochs[member_id] = answer.member_epoch
        if not changed:
            return epochs
    raise AssertionError(f"not stable: {epochs}")


async def test_a_steady_heartbeat_is_answered_again_with_the_general_paths_bytes(env: Env) -> None:
    served = Served(env)
    epoch = (await _stable(env))["a"]
    first = served.steady(steady_request("a", epoch, correlation_id=1))
    assert first is not None and served.hits == 0  # answered by the shortcut, kept
    for correlation_id in (2, -5, 2**31 - 1):
        frame = steady_request("a", epoch, correlation_id=correlation_id)
        again = served.steady(frame)
        assert again == await served.general(frame)  # the full path's bytes, byte for byte
        assert again == await served.general(frame, shortcut=True)
    assert served.hits == 3
    v0 = steady_request("a", epoch, version=0, correlation_id=9)
    assert served.steady(v0) == await served.general(v0)  # another version's bytes: kept separately
    assert served.steady(v0) == await served.general(v0)
    assert served.hits == 4


async def test_answered_again_the_session_deadline_moves_as_the_general_paths(env: Env) -> None:
    served = Served(env)
    epoch = (await _stable(env))["a"]
    frame = steady_request("a", epoch)
    served.steady(frame)
    for _ in range(30):  # 30 × 2 s: the member outlives its 45 s session by heartbeating
        env.advance(2_000)
        assert served.steady(frame) is not None
    assert served.hits > 0  # (every few: the subscribed topics are looked at again, by the shortcut)
    hits = served.hits
    assert served.steady(frame) is not None and served.hits == hits + 1  # the last one answered again
    session = env.runtime.consumer_groups._timers[("session", GROUP, "a")]
    assert session.deadline_ms == env.clock.now_ms() + SESSION_MS
    env.advance(SESSION_MS - 1)
    assert "a" in env.group().members
    env.advance(1)  # a session timeout after the last heartbeat, as if each had rescheduled the timer
    assert "a" not in env.group().members
    hits = served.hits
    answer = await served.served(frame)  # session over: the general path answers
    assert served.hits == hits and error_of(answer)[0] == Errors.UNKNOWN_MEMBER_ID


async def test_not_taken_once_the_members_fields_changed(env: Env) -> None:
    served = Served(env)
    epoch = (await _stable(env))["a"]
    frame = steady_request("a", epoch)
    served.steady(frame)
    served.steady(frame)
    assert served.hits == 1
    racked = await env.heartbeat("a", epoch, rack_id="r1")  # the member changed through the general path
    assert racked.error == Errors.NONE
    answer = served.steady(frame)  # its steady bytes again: looked at again by the shortcut
    assert served.hits == 1 and answer == await served.general(frame)
    other_client = steady_request("a", epoch, client_id="other")
    assert served.steady(other_client) is None  # a new client id is written: the general path
    assert served.hits == 1


async def test_not_taken_once_the_groups_epoch_is_ahead(env: Env) -> None:
    served = Served(env)
    epoch = (await _stable(env))["a"]
    frame = steady_request("a", epoch)
    served.steady(frame)
    await env.heartbeat("b", 0)  # a join: the group epoch is bumped, a new target is due
    group = env.group()
    assert group.group_epoch > epoch
    assert served.steady(frame) is None  # the general path computes the target
    assert served.hits == 0


async def test_not_taken_once_the_members_epoch_is_behind(env: Env) -> None:
    served = Served(env)
    epoch = (await _stable(env))["a"]
    frame = steady_request("a", epoch)
    served.steady(frame)
    served.steady(frame)
    assert served.hits == 1
    await env.heartbeat("b", 0)  # b joins: a is told to revoke half, then moves to the new epoch
    revoking = await env.heartbeat("a", epoch)
    moved = await env.heartbeat("a", epoch, owned=dict(revoking.assignment or {}))
    assert moved.error == Errors.NONE and moved.member_epoch > epoch
    answer = await served.served(frame)  # the old epoch's steady bytes
    assert served.hits == 1
    assert answer == await served.general(frame)
    assert error_of(answer)[0] == Errors.FENCED_MEMBER_EPOCH


async def test_not_taken_while_a_write_of_the_group_is_not_acknowledged(env: Env) -> None:
    served = Served(env)
    epochs = await _stable(env, "a", "b")
    frame = steady_request("a", epochs["a"])
    served.steady(frame)
    gate = env.store.hold_next_write()
    racked = env.runtime.start_consumer_group_heartbeat(HeartbeatRequest(
        GROUP, "b", epochs["b"], rack_id="r1", client_id="b", client_host="/127.0.0.1"))
    assert type(racked) is not HeartbeatResponse  # b's new rack is being written
    assert env.group().group_epoch == epochs["a"]  # a's own state did not change
    assert served.steady(frame) is None and served.hits == 0  # answered after the write, by the general path
    gate.set()
    await racked  # type: ignore[misc]
    assert served.steady(frame) is not None and served.hits == 0  # the shortcut again, kept again
    assert served.steady(frame) is not None and served.hits == 1


async def test_not_taken_after_the_groups_configuration_changed_and_read_again_as_the_shortcut_does(env: Env) -> None:
    served = Served(env)
    overrides: dict[str, str] = {}

    asked: list[list[str]] = []

    async def describe(group_ids: list[str]) -> dict[str, dict[str, str]]:
        asked.append(group_ids)
        return {group_id: dict(overrides) for group_id in group_ids}

    configs = env.runtime.consumer_groups.group_configs
    configs.describe = describe
    await configs.first_read(GROUP)
    epoch = (await _stable(env))["a"]
    frame = steady_request("a", epoch)
    served.steady(frame)
    served.steady(frame)
    assert served.hits == 1
    overrides["consumer.heartbeat.interval.ms"] = "7000"
    configs.invalidate([GROUP])
    for _ in range(5):  # the reads are done
        await asyncio.sleep(0)
    answer = served.steady(frame)
    assert served.hits == 1  # the shortcut answers with the group's new interval
    assert answer == await served.general(frame)
    _correlation_id, body = codec.decode_response(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, answer[4:])
    assert body.heartbeat_interval == datetime.timedelta(milliseconds=7_000)
    assert served.steady(frame) == answer and served.hits == 2
    configs.invalidate([GROUP])  # read again, the same values: still answered again
    for _ in range(5):
        await asyncio.sleep(0)
    assert served.steady(frame) == answer and served.hits == 3
    reads = len(asked)
    env.advance(env.config.group_config_refresh_interval_ms)  # due to be read again: read from this path too
    assert served.steady(frame) == answer and served.hits == 4
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(asked) == reads + 1


async def test_the_subscribed_topics_are_looked_at_again_as_the_shortcut_looks(env: Env) -> None:
    served = Served(env)
    epoch = (await _stable(env))["a"]
    frame = steady_request("a", epoch)
    served.steady(frame)
    group = env.group()
    interval_ms = env.runtime.consumer_groups.settings.metadata_refresh_interval_ms
    env.advance(group.metadata_refresh_deadline_ms - env.clock.now_ms())  # due: looked at, unchanged
    assert served.steady(frame) == await served.general(frame) and served.hits == 1
    assert group.metadata_refresh_deadline_ms == env.clock.now_ms() + interval_ms
    env.topics.put(TopicImage(FOO, "foo", 12))  # the topic grew
    env.advance(interval_ms - 1)
    assert served.steady(frame) is not None and served.hits == 2  # not looked at before the deadline
    env.advance(1)
    assert served.steady(frame) is None and served.hits == 2  # looked at: changed, the general path bumps
    assert (group.group_epoch, group.metadata_refresh_deadline_ms) == (epoch, env.clock.now_ms())  # untouched
    answer = await served.general(frame, shortcut=True)
    assert error_of(answer) == (Errors.NONE, epoch + 1)


async def test_one_entry_per_member_and_a_bounded_count(env: Env) -> None:
    served = Served(env)
    epochs = await _stable(env, "a", "b", "c")
    for member_id in ("a", "b"):
        served.steady(steady_request(member_id, epochs[member_id]))
    renamed = steady_request("a", epochs["a"], client_id="renamed")
    assert served.steady(renamed) is None  # the new client id is written by the general path
    await served.general(renamed, shortcut=True)
    assert served.steady(renamed) is not None  # a's latest request replaces its earlier one
    answers = served.ctx.steady_answers
    assert answers is not None and len(answers.by_request) == 2
    answers.max_entries = 2
    served.steady(steady_request("c", epochs["c"]))  # a third member: the full entries are forgotten first
    assert len(answers.by_request) == 1
    assert served.steady(steady_request("c", epochs["c"])) is not None and answers.hits == 1
