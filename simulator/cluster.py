"""Several coordinator instances sharing the state topic: Kafka's side of it, simulated.

The production `Ownership` (loads, unloads, the zombie guard and its confirmation, fences), `OwnerMap` (its loop
side: `set_own`, the merge of a description), `OwnerMapDirectory` (FindCoordinator's answer) and
`GroupAssignmentReader` run unmodified. Simulated here is what they talk to through librdkafka threads:

  - `InstancesGroup`: the broker's consumer group of the instances ("<state topic>.coordinators") with the
    cooperative-sticky assignor: a member that stops heartbeating is removed after its session timeout and its
    partitions go to the others at once; a partition that moves between two live members is first revoked
    (the rebalance waits for the member's on_revoked to return: it unloads) and only then assigned; a removed
    member learns it at its next heartbeat (UNKNOWN_MEMBER_ID): on_lost, then it joins again. While Kafka is
    down nothing moves, and sessions start afresh when it is back (a broker's group coordinator reloading).
  - `SimMembership`: coordinator/cluster/membership.py's surface (start, close, member_id), its callbacks run
    on the loop and waited for, its heartbeats every 500 ms while the process runs.
  - the guard's pulse: Ownership's watcher thread and tick, every stall_ms / 4 while the process runs; a paused
    process (SIGSTOP, a VM freeze) neither pulses nor heartbeats nor answers, so when it wakes the guard finds
    the gap first, before any request it held is handled.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coordinator.cluster.owner_map import Described, DescribedMember

if TYPE_CHECKING:
    from coordinator.cluster.ownership import Ownership
    from simulator.instance import CoordinatorInstance
    from simulator.run import Simulation

HEARTBEAT_MS = 500
REBALANCE_STEP_MS = 100


@dataclass(eq=False)
class _Member:
    member_id: str
    membership: SimMembership
    last_heartbeat_ms: int
    owned: set[int] = field(default_factory=set)


class InstancesGroup:
    def __init__(self, sim: Simulation, partitions: int, session_ms: int) -> None:
        self.sim = sim
        self.partitions = partitions
        self.session_ms = session_ms
        self.members: dict[str, _Member] = {}
        self.generation = 0
        self.stable = True
        self._next_member = 0
        self._dirty = False
        self._rebalancing: asyncio.Task[None] | None = None
        self._was_down = False
        self._expiring: asyncio.Task[None] | None = None
        # describe()'s answer until the members, their partitions or the stability change (every instance's owner
        # map asks every second; an unchanged group gives an equal description, built once)
        self._described: Described | None = None

    # --- what a member does -----------------------------------------------------------------------------------
    def join(self, membership: SimMembership) -> str:
        if self._expiring is None:
            self._expiring = self.sim.loop.create_task(self._expire_sessions())
        member_id = f"{membership.client_id.split('|')[1]}-{self._next_member}"
        self._next_member += 1
        self.members[member_id] = _Member(member_id, membership, self.sim.now_ms())
        self._described = None
        self.sim.history.record("instances_join", member=member_id)
        self._rebalance_soon()
        return member_id

    def heartbeat(self, member_id: str) -> bool:
        """False: the member is unknown (removed after its session ran out)."""
        member = self.members.get(member_id)
        if member is None:
            return False
        if self.sim.kafka.is_up:
            member.last_heartbeat_ms = self.sim.now_ms()
        return True

    def leave(self, member_id: str) -> None:
        if self.members.pop(member_id, None) is not None:
            self._described = None
            self.sim.history.record("instances_leave", member=member_id)
            self._rebalance_soon()

    def owner_of(self, partition: int) -> str | None:
        """The process (client.id of its store) Kafka assigns `partition` to now, if any."""
        for member in self.members.values():
            if partition in member.owned:
                return member.membership.process
        return None

    def describe(self) -> Described:
        if self._described is None:
            members = tuple(DescribedMember(m.member_id, m.membership.client_id,
                                            tuple(sorted(m.owned)) if self.stable else None)
                            for m in self.members.values())
            self._described = Described(members, self.stable)
        return self._described

    # --- the group coordinator --------------------------------------------------------------------------------
    async def _expire_sessions(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_MS / 1000)
            now = self.sim.now_ms()
            if not self.sim.kafka.is_up:
                self._was_down = True
                continue
            if self._was_down:  # the group coordinator came back: every session starts afresh
                self._was_down = False
                for member in self.members.values():
                    member.last_heartbeat_ms = now
            expired = [m for m in self.members.values() if now - m.last_heartbeat_ms > self.session_ms]
            for member in expired:
                del self.members[member.member_id]
                self._described = None
                self.sim.history.record("instances_expired", member=member.member_id)
            if expired:
                self._rebalance_soon()

    def _rebalance_soon(self) -> None:
        self._dirty = True
        self.stable = False
        self._described = None
        if self._rebalancing is None or self._rebalancing.done():
            self._rebalancing = self.sim.loop.create_task(self._rebalance())

    async def _rebalance(self) -> None:
        while self._dirty:
            self._dirty = False
            self.stable = False
            self._described = None
            # every member must join the rebalance: a paused one cannot, and is removed when its session ends
            while not self.sim.kafka.is_up or any(m.membership.instance.paused for m in self.members.values()):
                await asyncio.sleep(REBALANCE_STEP_MS / 1000)
            target = self._sticky()
            # cooperative: partitions changing hands are revoked first, and assigned only once given up
            revoking = {m: m.owned - target[m.member_id] for m in self.members.values()
                        if m.owned - target[m.member_id]}
            waits = {m: self.sim.loop.create_task(m.membership.revoke(parts)) for m, parts in revoking.items()}
            while any(not task.done() and m.member_id in self.members for m, task in waits.items()):
                await asyncio.sleep(REBALANCE_STEP_MS / 1000)
            for m, parts in revoking.items():
                m.owned -= parts
            self._described = None
            if self._dirty or any(m.membership.instance.paused for m in self.members.values()):
                self._dirty = True  # membership changed while revoking, or someone cannot join: start over
                continue
            self.generation += 1
            for member in list(self.members.values()):
                new = target[member.member_id] - member.owned
                member.owned = set(target[member.member_id])
                self._described = None
                member.membership.assign(new)
            self.sim.history.record("instances_assigned", gen=self.generation,
                                    owners=tuple((m.member_id, tuple(sorted(m.owned)))
                                                 for m in self.members.values()))
        self.stable = True
        self._described = None

    def _sticky(self) -> dict[str, set[int]]:
        """Cooperative-sticky: each member keeps what it owns as far as balance allows; the rest spreads."""
        ids = sorted(self.members)
        target: dict[str, set[int]] = {member_id: set() for member_id in ids}
        if not ids:
            return target
        most = -(-self.partitions // len(ids))
        free: list[int] = []
        taken: set[int] = set()
        for member_id in ids:
            for partition in sorted(self.members[member_id].owned):
                if len(target[member_id]) < most and partition not in taken:
                    target[member_id].add(partition)
                    taken.add(partition)
        free = [p for p in range(self.partitions) if p not in taken]
        for partition in free:
            fewest = min(ids, key=lambda member_id: (len(target[member_id]), member_id))
            target[fewest].add(partition)
        return target


class SimMembership:
    """coordinator/cluster/membership.py's Membership, for one instance, on the simulated instances group."""

    def __init__(self, instance: CoordinatorInstance, ownership: Ownership, client_id: str) -> None:
        self.instance = instance
        self.ownership = ownership
        self.client_id = client_id
        self.process = instance.process
        self.group = instance.sim.instances_group
        self.assigned: set[int] = set()
        self._member_id: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._callbacks: asyncio.Lock = asyncio.Lock()  # one rebalance callback at a time, as on its thread
        self._closed = False
        self._unsubscribed = False  # the consumer's close() has begun: no heartbeats, no rebalance callbacks

    @property
    def member_id(self) -> str | None:
        return self._member_id

    def start(self) -> None:
        self._task = self.instance.sim.loop.create_task(self._heartbeats())

    async def close(self) -> None:
        """Membership.close(): its thread sees the close only once the rebalance callback it is in has returned (a
        revoke waiting for a load to end, say), and librdkafka heartbeats meanwhile (a member whose application
        has not returned from its rebalance callback is in join state WAIT_UNASSIGN_CALL or WAIT_ASSIGN_CALL, which
        heartbeat while subscribed: rdkafka_cgrp.c, rd_kafka_cgrp_join_state_serve). Then the consumer's close():
        it unsubscribes (no heartbeat after that, and no rebalance callback but its own), revokes everything
        (unloaded first), then LeaveGroup."""
        self._closed = True
        async with self._callbacks:  # the callback under way (and those queued before) first, heartbeating
            self._unsubscribed = True
            if self._task is not None:
                self._task.cancel()
            if self.assigned:
                await self._deliver("revoked", set(self.assigned))
        if self._member_id is not None:
            self.group.leave(self._member_id)
            self._member_id = None

    def kill(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()

    async def _heartbeats(self) -> None:
        self._member_id = self.group.join(self)
        while True:
            await asyncio.sleep(HEARTBEAT_MS / 1000)
            await self.instance.running()
            if not self.instance.sim.kafka.is_up:
                continue
            if self._member_id is not None and not self.group.heartbeat(self._member_id):
                lost = set(self.assigned)
                self._member_id = None
                if lost:
                    await self._callback("lost", lost)
                self._member_id = self.group.join(self)

    # --- the group's rebalance callbacks ----------------------------------------------------------------------
    async def revoke(self, partitions: set[int]) -> None:
        await self._callback("revoked", partitions)

    def assign(self, partitions: set[int]) -> None:
        self.instance.sim.loop.create_task(self._callback("assigned", partitions))

    async def _callback(self, kind: str, partitions: set[int]) -> None:
        async with self._callbacks:
            if not self._unsubscribed:
                await self._deliver(kind, partitions)

    async def _deliver(self, kind: str, partitions: set[int]) -> None:
        await self.instance.running()
        if not self.instance.alive:
            return
        if kind == "assigned":
            self.assigned |= partitions
            await self.ownership.on_assigned(partitions)
        elif partitions & self.assigned:
            given = partitions & self.assigned
            self.instance.sim.history.record(f"instances_{kind}", inst=self.instance.number,
                                             partitions=tuple(sorted(given)))
            callback = self.ownership.on_revoked if kind == "revoked" else self.ownership.on_lost
            await callback(given)
            self.assigned -= given


async def guard_pulse(instance: CoordinatorInstance, ownership: Ownership) -> None:
    """Ownership's watcher thread and tick on virtual time: a pulse and a check every stall_ms / 4 while the
    process runs."""
    tick_s = ownership.guard.stall_ms / 4000
    while True:
        await asyncio.sleep(tick_s)
        await instance.running()
        ownership.guard.pulse()
        ownership.guard.check()


async def refresh_owner_map(instance: CoordinatorInstance, owner_map: Any, refresh_ms: int = 1_000) -> None:
    """OwnerMap's refresh thread: a description of the instances group every second (none while Kafka is down).
    A description equal to the one the map holds is not applied again: merging it again gives the same map (the
    assignments it remembers are those of that description already), and it costs the most of the simulator's
    own work in a run with several instances."""
    while True:
        await asyncio.sleep(refresh_ms / 1000)
        await instance.running()
        if instance.sim.kafka.is_up:
            described = instance.sim.instances_group.describe()
            if described != owner_map._described:
                owner_map._apply(described)


async def describe_fresh(instance: CoordinatorInstance) -> Described:
    """OwnerMap.describe_fresh: a description taken after the call (a round trip; fails while Kafka is down)."""
    sim = instance.sim
    await asyncio.sleep(sim.rng_net.randint(1, 10) / 1000)
    described = sim.instances_group.describe() if sim.kafka.is_up else None
    # A paused process (SIGSTOP) reads the answer when it wakes, after its guard found the pause: a confirmation
    # must not be acted on during the pause it does not cover (seed 5538 resumed, loaded and fenced in one)
    await instance.running()
    if described is None:
        raise ConnectionError("the instances group's coordinator is unreachable (simulated outage)")
    return described
