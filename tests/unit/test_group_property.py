"""Property test: random histories of join/sync/heartbeat/leave/commit/clock advances over two groups.

They never raise, keep every group's bookkeeping consistent, never leave a member in two groups, and once the
surviving clients follow the protocol, every group ends Stable (all clients synced) or Empty.
"""
from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.group.api import OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic
from protocol.error_codes import Errors
from coordinator.group.metadata import GroupMetadata
from coordinator.group.state import GroupState
from tests.support.group_harness import Client, Env, drain
from tests.support.group_invariants import check_invariants

GROUPS = ("g1", "g2")
CLIENTS = [("c0", "g1", None), ("c1", "g1", "static-1"), ("c2", "g1", None),
           ("c3", "g2", None), ("c4", "g2", "static-4"), ("c5", "g1", None)]
REJOIN_ERRORS = {Errors.REBALANCE_IN_PROGRESS}


class Driver:
    """A client that follows the protocol when stepped; random histories call its pieces out of order."""

    def __init__(self, env: Env, name: str, group_id: str, instance_id: str | None) -> None:
        self.c = Client(env, name, group_id, instance_id=instance_id, session_timeout_ms=10_000,
                        rebalance_timeout_ms=20_000)
        self.synced = False

    def reset(self) -> None:
        """Forget the membership, including an in-flight SyncGroup's answer (it belongs to the old id)."""
        self.c.member_id, self.c.generation, self.synced = "", -1, False
        self.c.sync_task = None

    async def join(self) -> None:
        if self.c.join_task is None:
            self.synced = False
            await self.c.start_join()

    async def collect_join(self) -> None:
        task = self.c.join_task
        if task is None or not task.done():
            return
        resp = self.c.take_join()
        if resp.error_code == Errors.NONE:
            assignment = {m.member_id: b"a" for m in resp.members} if self.c.is_leader else {}
            await self.c.start_sync(assignment)
        elif resp.error_code not in REJOIN_ERRORS:
            self.reset()

    async def collect_sync(self) -> None:
        task = self.c.sync_task
        if task is None or not task.done():
            return
        self.c.sync_task = None
        error = task.result().error_code
        if error == Errors.NONE:
            self.synced = True
        elif error not in REJOIN_ERRORS:
            self.reset()

    async def heartbeat(self) -> None:
        if not self.c.member_id or self.c.join_task is not None:
            return
        error = await self.c.heartbeat()
        if error in REJOIN_ERRORS:
            self.synced = False
        elif error != Errors.NONE:
            self.reset()

    async def restart(self) -> None:
        """The process restarts: it forgets its member id (a static member then replaces itself)."""
        self.c.join_task = self.c.sync_task = None
        self.reset()
        await self.join()

    async def leave(self) -> None:
        if self.c.member_id and self.c.join_task is None:
            await self.c.leave()
            self.reset()

    async def commit(self) -> None:
        req = OffsetCommitRequest(self.c.group_id, self.c.generation, self.c.member_id,
                                  [OffsetCommitRequestTopic("t", [OffsetCommitRequestPartition(0, 1)])],
                                  group_instance_id=self.c.instance_id)
        await self.c.coordinator.commit_offsets(req)

    async def follow_protocol(self) -> None:
        await self.collect_join()
        await self.collect_sync()
        if self.c.join_task is None and self.c.sync_task is None:
            if self.synced:
                await self.heartbeat()
            if not self.synced and self.c.sync_task is None:
                await self.join()


ACTIONS = st.one_of(
    st.tuples(st.sampled_from(["join", "collect", "heartbeat", "leave", "commit", "restart"]),
              st.integers(0, len(CLIENTS) - 1)),
    st.tuples(st.just("advance"), st.integers(0, 12_000)),
)


async def run_history(history: list[tuple[str, int]]) -> None:
    env = Env(group_initial_rebalance_delay_ms=1_000)
    drivers = [Driver(env, *spec) for spec in CLIENTS]
    try:
        for action, arg in history:
            if action == "advance":
                await env.advance(arg, step_ms=1_000)
            else:
                d = drivers[arg]
                if action == "collect":
                    await d.collect_join()
                    await d.collect_sync()
                else:
                    await getattr(d, action)()
            await drain()
            check_invariants(env)
        await settle(env, drivers)
    finally:
        await env.close()


async def settle(env: Env, drivers: list[Driver]) -> None:
    for _ in range(240):
        for d in drivers:
            await d.follow_protocol()
        await drain()
        check_invariants(env)
        if settled(env, drivers):
            return
        await env.advance(500, step_ms=500)
    raise AssertionError({g: env.state(g) for g in GROUPS})


def settled(env: Env, drivers: list[Driver]) -> bool:
    for group_id in GROUPS:
        group = env.group(group_id)
        if group is None or group.state is GroupState.EMPTY:
            continue
        if group.state is not GroupState.STABLE:
            return False
        mine = [d for d in drivers if d.c.group_id == group_id]
        if not all(d.synced and d.c.generation == group.generation_id and d.c.member_id in group.members
                   for d in mine):
            return False
        if len(group.members) != len(mine):
            return False
    return True


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ACTIONS, max_size=40))
def test_random_histories_settle(history: list[tuple[str, int]]) -> None:
    asyncio.run(run_history(history))
