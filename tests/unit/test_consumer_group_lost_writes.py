"""A consumer group's write lost while later ones landed, met at the load or at the answer (the simulator's seeds
2137 of --protocol mixed, 1064 and 2013 of --protocol upgrade). Our writes are separate transactions: one can
time out unappended while later ones land, and a writer that gives its partition up before the outcome is known
repairs nothing (docs/architecture.md, "A failed write"). Manual clock, in-memory store
(tests/support/group_harness.py)."""
from __future__ import annotations

import asyncio
import uuid

from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
from coordinator.group.modern.records import GroupEpochRecord
from coordinator.group.store import InMemoryGroupStore
from coordinator.topics import StaticTopics, TopicImage
from protocol.error_codes import Errors
from tests.support.group_harness import Env, drain, env  # noqa: F401

T = uuid.UUID(int=0x7)


def _heartbeat(env: Env, member_id: str, epoch: int = 0, owned: list[tuple[uuid.UUID, list[int]]] | None = None
               ) -> asyncio.Task[HeartbeatResponse]:
    joining = epoch == 0
    return asyncio.ensure_future(env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
        "g", member_id, epoch, rebalance_timeout_ms=30_000 if joining else -1,
        subscribed_topic_names=("t",) if joining else None, owned=[] if joining else owned, client_id=member_id,
        client_host="/127.0.0.1")))


def _owned(response: HeartbeatResponse) -> list[tuple[uuid.UUID, list[int]]]:
    assert response.assignment is not None
    return [(topic_id, list(partitions)) for topic_id, partitions in response.assignment.items()]


async def test_a_member_whose_epoch_the_loaded_group_does_not_reach_is_never_told_a_lower_one(env: Env) -> None:
    """c's join (group epoch 2 and its target) waits in the producer's queue while a reconciles to epoch 2 (its
    revocation, then its new epoch: both land and are answered); the partition is given up and the join then
    times out unappended. The log holds a at epoch 2 beside group and target epoch 1, which no log without a gap
    holds. The load writes a group epoch past 2: a's next heartbeat computes a target at epoch 3 and a moves on
    to it. On the code before, the load kept epoch 1, a's target at epoch 1 took it back there, and a was told
    epoch 1 after 2 (seed 2137 of --protocol mixed: a static join's group epoch 6 and its repairs timed out, a
    member's assignment at epoch 6 landed, the owed repair went with the partition; told epoch 4 after 6)."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 4)])
    store = env.store
    assert isinstance(store, InMemoryGroupStore)
    a = await _heartbeat(env, "a")
    assert a.error == Errors.NONE and a.member_epoch == 1
    gate = store.hold_next_write()  # c's join: waits in the producer's queue
    joining = _heartbeat(env, "c")
    await drain()
    group = env.coordinator.shard_for("g").consumer_groups["g"]
    assert group.group_epoch == group.assignment_epoch == 2 and not joining.done()
    revoking = await _heartbeat(env, "a", 1, _owned(a))  # lands: told to revoke, still at epoch 1
    assert revoking.error == Errors.NONE and revoking.member_epoch == 1
    moved = await _heartbeat(env, "a", 1, _owned(revoking))  # lands: epoch 2
    assert moved.error == Errors.NONE and moved.member_epoch == 2 and moved.assignment is None
    partition = env.coordinator.shard_for("g").partition
    await env.coordinator.unload([partition])
    store.unloaded.discard(partition)
    store.fail_next_write(Errors.REQUEST_TIMED_OUT)  # c's join: not appended
    gate.set()
    await drain()
    assert (await joining).error != Errors.NONE
    await env.coordinator.load([partition])
    await drain()
    group = env.coordinator.shard_for("g").consumer_groups["g"]
    assert set(group.members) == {"a"} and group.members["a"].member_epoch == 2
    told = await _heartbeat(env, "a", 2, _owned(revoking))  # (moved's assignment: unchanged)
    assert told.error == Errors.NONE and told.member_epoch > 2, f"told epoch {told.member_epoch} after 2"
    group = env.coordinator.shard_for("g").consumer_groups["g"]
    assert told.member_epoch == group.group_epoch == group.assignment_epoch
    raised = [r.epoch for r in store.consumer_records if isinstance(r, GroupEpochRecord)]
    assert raised[-1] == group.group_epoch, "the raised epoch is in the log"
