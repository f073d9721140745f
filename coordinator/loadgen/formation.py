"""A Stable group formed the way real consumers form it, for tests and tools that then drive its members by hand.

Members join at once, and whoever is answered into a generation the others are not in simply rejoins when its
heartbeat says REBALANCE_IN_PROGRESS, like Kafka's consumer, until all of them are in one generation and synced.
So it does not depend on every JoinGroup arriving within the initial rebalance delay (on a busy machine one may
not: the group then completes without it, and a helper that joins once and expects one generation is flaky).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from protocol.client import KafkaClient

from coordinator.loadgen.simulation import SimOptions, Simulation


@dataclass(frozen=True)
class FormedMember:
    client: KafkaClient  # its connection, left open: the caller's to use and close
    member_id: str
    generation_id: int
    leader: str  # the generation's leader (a member id)
    assignment: bytes  # what its SyncGroup returned (consumer-protocol Assignment)
    members: int  # how many members the leader's JoinGroup response listed

    @property
    def is_leader(self) -> bool:
        return self.member_id == self.leader


async def form_stable_group(host: str, port: int, group_id: str, size: int = 2, *, session_ms: int = 30_000,
                            rebalance_ms: int = 30_000, topic: str = "orders", partitions: int = 3,
                            timeout_s: float = 60.0) -> list[FormedMember]:
    """`size` members in one Stable generation of `group_id`; they stop heartbeating once formed (no LeaveGroup:
    the caller carries on with their identities and connections before their sessions run out)."""
    sim = Simulation(SimOptions(coordinator=(host, port), named_groups=(group_id,), members=size, topic=topic,
                                partitions=partitions, session_ms=session_ms, rebalance_ms=rebalance_ms,
                                heartbeat_ms=max(100, min(1_000, session_ms // 4)), commit_interval_ms=0,
                                leave_on_exit=False))
    sim.start_members()
    deadline = time.monotonic() + timeout_s
    try:
        while not sim.all_stable():
            if time.monotonic() > deadline:
                phases = {m.key: m.phase for m in sim.members}
                raise TimeoutError(f"group {group_id} not Stable within {timeout_s} s: {phases}")
            await asyncio.sleep(0.05)
    except BaseException:
        await sim.close()
        raise
    await asyncio.gather(*(m.halt(abort=False) for m in sim.members))
    await sim.close_discovery()
    size_seen = max(m.joined_members for m in sim.members)  # the leader's JoinGroup member list
    formed = []
    for member in sim.members:
        assert member.client is not None
        formed.append(FormedMember(member.client, member.member_id, member.generation, member.leader_id,
                                   member.assignment, size_seen))
    return formed
