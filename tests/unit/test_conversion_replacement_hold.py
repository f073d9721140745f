"""A classic group's static replacement whose write is unanswered when the group is converted to a consumer group
(KIP-848 online upgrade), then the replacement's write and the conversion's are answered in every order.

Kafka 4's convertToConsumerGroup answers the classic group's parked JoinGroups REBALANCE_IN_PROGRESS (the
replacing member's with it: the replacement's append future completes it again later, a no-op); a conversion
whose write fails leaves the classic group object in place, and the replacement's append future reverts that very
object if its own write failed. So the classic group put back after a failed conversion holds the new member id
only if the replacement's write was not failed. Manual clock, in-memory store (tests/support/group_harness.py)."""
from __future__ import annotations

import asyncio
import gc
import uuid

import pytest

from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
from coordinator.group.state import GroupState
from coordinator.group.store import InMemoryGroupStore
from coordinator.topics import StaticTopics, TopicImage
from protocol.consumer_protocol import Assignment, encode_assignment
from protocol.error_codes import Errors
from tests.support.group_harness import Client, Env, advance_until_joined, drain, env  # noqa: F401
from tests.support.graphs import unreachable_cycles
from tests.support.group_invariants import check_group

T = uuid.UUID(int=0x7)


async def _stable_static_group(env: Env) -> tuple[Client, Client, InMemoryGroupStore]:
    """Static members x and y (the consumer protocol's subscription and assignments, so the group converts), and
    the store whose writes the test holds and fails."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 2)])
    x, y = env.client("x", instance_id="ix"), env.client("y", instance_id="iy")
    for client in (x, y):
        await client.start_join()
    await advance_until_joined(env, x, y)
    for client in (x, y):
        assert client.take_join().error_code == Errors.NONE
    leader = x if x.is_leader else y
    await leader.start_sync({c.member_id: encode_assignment(Assignment((("t", (i,)),)), 0)
                             for i, c in enumerate((x, y))})
    await (y if leader is x else x).start_sync()
    for client in (x, y):
        assert client.sync_task is not None and client.sync_task.done()
        assert client.sync_task.result().error_code == Errors.NONE
    assert env.state() is GroupState.STABLE
    assert isinstance(env.store, InMemoryGroupStore)
    return x, y, env.store


def _upgrade(env: Env) -> asyncio.Task[HeartbeatResponse]:
    """A consumer-protocol member joins: the classic group is converted (its answer waits for the write)."""
    return asyncio.ensure_future(env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
        "g", "c", 0, rebalance_timeout_ms=30_000, subscribed_topic_names=("t",), owned=[], client_id="c",
        client_host="/127.0.0.1")))


def _consumer_groups(env: Env) -> dict[str, ConsumerGroup]:
    return env.coordinator.shard_for("g").consumer_groups


def _stored_static_members(env: Env) -> dict[str, str]:
    store = env.store
    assert isinstance(store, InMemoryGroupStore)
    return {m.group_instance_id or "": m.member_id for m in store.groups["g"].members}


ORDERS = [
    # (the replacement's write, the conversion's write, which is answered first)
    ("failed", "failed", "replacement"),
    ("failed", "failed", "conversion"),
    ("failed", "acked", "replacement"),
    ("failed", "acked", "conversion"),
    ("acked", "failed", "replacement"),
    ("acked", "failed", "conversion"),
    ("acked", "acked", "replacement"),
    ("acked", "acked", "conversion"),
]


@pytest.mark.parametrize("replacement, conversion, first", ORDERS)
async def test_conversion_while_a_static_replacement_write_is_in_flight(env: Env, replacement: str,
                                                                        conversion: str, first: str) -> None:
    gc.collect()
    gc.disable()  # what the decisions leave for the collector is looked for at the end
    try:
        await _conversion_scenario(env, replacement, conversion, first)
    finally:
        gc.enable()


async def _conversion_scenario(env: Env, replacement: str, conversion: str, first: str) -> None:
    x, y, store = await _stable_static_group(env)
    gate_replacement, gate_conversion = store.hold_next_write(), store.hold_next_write()
    x2 = env.client("x", instance_id="ix")
    await x2.start_join()  # Stable, same protocol: the new id is written, no rebalance
    classic = env.group()
    new_x = classic.static_members["ix"]
    assert new_x != x.member_id and x2.join_task is not None and not x2.join_task.done()
    holds = list(classic.replacement_holds or ())
    assert len(holds) == 1
    upgrade = _upgrade(env)
    await drain()
    assert "g" in _consumer_groups(env) and not upgrade.done()
    # (a) the replacing member's JoinGroup is answered by the conversion, as Kafka's completeAllJoinFutures does;
    # the replacement's outcome answers nothing more (its future is done: `_answer` leaves it)
    joined = x2.take_join()
    assert (joined.error_code, joined.member_id) == (Errors.REBALANCE_IN_PROGRESS, new_x)
    replaced_events = len(env.observer.of("replaced"))

    async def answer(which: str) -> None:
        outcome = replacement if which == "replacement" else conversion
        if outcome == "failed":
            store.fail_next_write(Errors.REQUEST_TIMED_OUT if which == "replacement" else Errors.NOT_ENOUGH_REPLICAS)
        (gate_replacement if which == "replacement" else gate_conversion).set()
        await drain()

    await answer(first)
    await answer("conversion" if first == "replacement" else "replacement")
    assert upgrade.done()
    if conversion == "acked":
        assert upgrade.result().error == Errors.NONE
        group = _consumer_groups(env)["g"]
        assert set(group.members) == {new_x, y.member_id, "c"} and group.members[new_x].instance_id == "ix"
        assert env.group() is not None and not env.group().members  # the offsets' holder only
        assert len(env.observer.of("replaced")) == replaced_events
        for member_id in list(group.members):
            env.coordinator.consumer_groups.cancel_all("g", member_id)
    else:
        # (b) the classic group put back is the one the log holds: the new id only if its own write was acked
        assert upgrade.result().error == Errors.COORDINATOR_NOT_AVAILABLE
        assert "g" not in _consumer_groups(env)
        restored = env.group()
        assert restored is not None and restored is not classic and restored.is_in(GroupState.STABLE)
        stored = _stored_static_members(env)
        assert stored == {"ix": new_x if replacement == "acked" else x.member_id, "iy": y.member_id}
        assert dict(restored.static_members) == stored
        check_group(restored)
        x2.member_id, x2.generation = new_x, x.generation  # what the conversion's answer told it
        if replacement == "acked":
            assert await x2.heartbeat() == Errors.NONE and await x.heartbeat() == Errors.FENCED_INSTANCE_ID
            assert len(env.observer.of("replaced")) == replaced_events
        else:  # reverted, as Kafka's append future reverts the classic group a failed conversion leaves in place
            assert await x.heartbeat() == Errors.NONE and await x2.heartbeat() == Errors.FENCED_INSTANCE_ID
            assert env.observer.of("replaced")[replaced_events:] == [("replaced", "g", new_x, x.member_id, "ix")]
        assert await y.heartbeat() == Errors.NONE
        assert restored.replacement_holds is None
    assert x2.join_task is None  # taken once above, nothing else parked for it
    # (c) every hold decided and let go of, on whichever group it ended in; no decision kept alive, no cycle
    assert classic.replacement_holds is None
    assert all(hold.on_settled is None and not hold.undecided for hold in holds)
    del classic, holds  # nothing but a cycle keeps them now
    assert _our_cycles() == []


@pytest.mark.parametrize("conversion", ["failed", "acked"])
async def test_conversion_while_two_static_replacement_writes_are_in_flight(env: Env, conversion: str) -> None:
    """x's replacement write A, then y's B (carrying x's new id), then the conversion C (carrying both), all
    unanswered; A and B fail, A first: x's revert is held by B and C, y's by C. C failed, the classic group put
    back is the one the log holds, both replacements reverted; C acknowledged, both new ids are stored."""
    gc.collect()
    gc.disable()
    try:
        x, y, store = await _stable_static_group(env)
        gates = [store.hold_next_write() for _ in range(3)]
        x2, y2 = env.client("x", instance_id="ix"), env.client("y", instance_id="iy")
        await x2.start_join()
        await y2.start_join()
        classic = env.group()
        new_x, new_y = classic.static_members["ix"], classic.static_members["iy"]
        holds = list(classic.replacement_holds or ())
        assert len(holds) == 2
        upgrade = _upgrade(env)
        await drain()
        assert [c.take_join().error_code for c in (x2, y2)] == [Errors.REBALANCE_IN_PROGRESS] * 2
        for gate, error in zip(gates, (Errors.REQUEST_TIMED_OUT, Errors.NOT_ENOUGH_REPLICAS,
                                       Errors.NOT_ENOUGH_REPLICAS if conversion == "failed" else None)):
            if error is not None:
                store.fail_next_write(error)
            gate.set()
            await drain()
        if conversion == "acked":
            assert upgrade.result().error == Errors.NONE
            group = _consumer_groups(env)["g"]
            assert set(group.members) == {new_x, new_y, "c"}
            for member_id in list(group.members):
                env.coordinator.consumer_groups.cancel_all("g", member_id)
        else:
            assert upgrade.result().error == Errors.COORDINATOR_NOT_AVAILABLE
            restored = env.group()
            assert restored is not None and restored is not classic
            assert dict(restored.static_members) == _stored_static_members(env) == {"ix": x.member_id,
                                                                                     "iy": y.member_id}
            check_group(restored)
            assert await x.heartbeat() == Errors.NONE and await y.heartbeat() == Errors.NONE
            assert restored.replacement_holds is None
        assert classic.replacement_holds is None
        assert all(hold.on_settled is None and not hold.undecided for hold in holds)
        del classic, holds
        assert _our_cycles() == []
    finally:
        gc.enable()


@pytest.mark.parametrize("replacement", ["failed", "acked"])
@pytest.mark.parametrize("converting", [False, True])
async def test_unload_while_a_static_replacement_write_is_in_flight(env: Env, replacement: str,
                                                                   converting: bool) -> None:
    """The partition is given up while the replacement's write (and the conversion's) is unanswered: the JoinGroup
    is answered once (by the conversion, or by the unload), nothing is put back, the holds are let go of."""
    gc.collect()
    gc.disable()
    try:
        x, y, store = await _stable_static_group(env)
        gate_replacement, gate_conversion = store.hold_next_write(), store.hold_next_write()
        x2 = env.client("x", instance_id="ix")
        await x2.start_join()
        classic = env.group()
        holds = list(classic.replacement_holds or ())
        upgrade = _upgrade(env) if converting else None
        await drain()
        await env.coordinator.unload([env.coordinator.partition_for("g")])
        await drain()
        joined = x2.take_join()
        assert joined.error_code == (Errors.REBALANCE_IN_PROGRESS if converting else Errors.NOT_COORDINATOR)
        if replacement == "failed":
            store.fail_next_write(Errors.REQUEST_TIMED_OUT)
        gate_replacement.set()
        await drain()
        gate_conversion.set()
        await drain()
        assert upgrade is None or upgrade.done()  # (sent before the unload, the in-memory store acknowledges it)
        assert env.group() is None and "g" not in _consumer_groups(env)
        assert classic.replacement_holds is None
        assert all(hold.on_settled is None and not hold.undecided for hold in holds)
        del classic, holds
        assert _our_cycles() == []
    finally:
        gc.enable()


def _our_cycles() -> list[list[str]]:
    """The reference cycles the collector finds now that hold an object of the coordinator's, but for those through
    an exception (a failed append's error and the frames of its traceback: the runtime's, not this path's)."""
    return [sorted({_name(o) for o in c}) for c in unreachable_cycles()
            if not any(isinstance(o, BaseException) for o in c) and any(_ours(o) for o in c)]


def _ours(obj: object) -> bool:
    return str(getattr(obj, "__module__", "") or type(obj).__module__).startswith(("coordinator", "protocol"))


def _name(obj: object) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__qualname__
