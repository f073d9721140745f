"""Ownership (coordinator/cluster/ownership.py) on the group harness's manual clock, with the membership consumer's
callbacks and the instances group's DescribeGroups scripted by the test (what Kafka would trigger and answer)."""
from __future__ import annotations

import asyncio

from coordinator.cluster.ownership import Ownership
from protocol.error_codes import Errors
from tests.support.group_harness import Env, commit, errors_of, form_group

SESSION_MS = 6_000
STALL_MS = SESSION_MS // 3


class ScriptedMembership:
    """Stands in for the membership consumer's thread: the test calls the callbacks Kafka would trigger."""

    def __init__(self, on_assigned, on_revoked, on_lost) -> None:  # type: ignore[no-untyped-def]
        self.on_assigned, self.on_revoked, self.on_lost = on_assigned, on_revoked, on_lost
        self.member_id = "member-1"
        self.assigned: set[int] = set()

    def start(self) -> None:
        pass

    async def close(self) -> None:  # librdkafka revokes everything before leaving
        if self.assigned:
            await self.on_revoked(set(self.assigned))

    async def assign(self, partitions: set[int]) -> None:
        self.assigned |= partitions
        await self.on_assigned(partitions)


class Confirmations:
    """DescribeGroups of the instances group as the test scripts it: our partitions, or None (rebalancing)."""

    def __init__(self) -> None:
        self.answer: set[int] | None = None
        self.calls = 0

    async def __call__(self, membership: object) -> set[int] | None:
        self.calls += 1
        return self.answer


async def started_ownership(env: Env) -> tuple[Ownership, ScriptedMembership, Confirmations]:
    """Every partition given up (an instance among several, before Kafka assigns it anything), then the
    instance's ownership started on a scripted membership."""
    runtime = env.coordinator
    await runtime.unload(range(runtime.num_partitions))
    ownership = Ownership(runtime, instance_id="i1", group_id="state.coordinators", topic="state",
                          session_timeout_ms=SESSION_MS, clock=env.clock, gc_after_moves=False, guard_ticks=False)
    membership = ScriptedMembership(ownership.on_assigned, ownership.on_revoked, ownership.on_lost)
    confirmations = Confirmations()
    await ownership.start(membership, confirmations)  # type: ignore[arg-type]
    return ownership, membership, confirmations


async def formed_then_owned(env: Env) -> tuple[Ownership, ScriptedMembership, Confirmations, int]:
    """Group "g" formed and committed to, every partition given up (as a multi-instance start), then the
    partition of "g" assigned to us and loaded back from the store."""
    a = env.client("a")
    await form_group(env, a)
    assert errors_of(await env.coordinator.commit_offsets(commit("g", a.generation, a.member_id,
                                                                 {("t", 0): 42}))) == [Errors.NONE]
    runtime = env.coordinator
    ownership, membership, confirmations = await started_ownership(env)
    partition = runtime.partition_for("g")
    await membership.assign({partition})
    await asyncio.wait_for(ownership.settled.wait(), 5)
    env.a = a  # type: ignore[attr-defined]
    return ownership, membership, confirmations, partition


def heartbeat(ownership: Ownership, env: Env) -> Errors:
    a = env.a  # type: ignore[attr-defined]
    return ownership.service.handle_heartbeat("g", a.generation, a.member_id)


class StuckLoads:
    """The store's load held until `gate` is set (Kafka's transaction coordinator not answering the fence):
    which loads started, which were stopped (cancelled) while held."""

    def __init__(self, env: Env) -> None:
        self.gate = asyncio.Event()
        self.started: list[set[int]] = []
        self.stopped: list[set[int]] = []
        self._load = env.store.load
        env.store.load = self  # type: ignore[method-assign]

    async def __call__(self, partitions):  # type: ignore[no-untyped-def]
        self.started.append(set(partitions))
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.stopped.append(set(partitions))
            raise
        return await self._load(partitions)
