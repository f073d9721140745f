"""The soak generator rejoins as a consumer does: against our real server (in-memory store), a rebalance started
by another member answers the generator's heartbeats REBALANCE_IN_PROGRESS and its members join again with
their ids; a member the coordinator removed is answered UNKNOWN_MEMBER_ID and joins again as a new member.
Either way every member is back on its heartbeat schedule, answered without error, so a rebalance does not
shrink the load the soak measures."""
from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

from bench.soak import Generator, Worker, join_and_sync
from coordinator.config import CoordinatorConfig
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.server import CoordinatorServer, ServerConfig
from coordinator.timer import SystemTimer
from protocol.apis import ApiKey, request_class
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from protocol.messages import build, item_class
from tests.support.polling import wait_until

GROUP = "soak-rejoin"


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[CoordinatorServer]:
    timer = SystemTimer("rejoin")
    timer.start()
    coordinator = GroupRuntime(CoordinatorConfig(group_initial_rebalance_delay_ms=0), timer, InMemoryGroupStore())
    server = CoordinatorServer(ServerConfig(listen_port=0), coordinator)
    await server.start()
    try:
        yield server
    finally:
        await server.close()
        await coordinator.shutdown()
        await timer.close()


async def _leave(client: KafkaClient, member_id: str) -> None:
    leave = request_class(ApiKey.LEAVE_GROUP, 5)
    identity = item_class(leave, "members")(member_id=member_id, group_instance_id=None, reason="test")
    answer = await client.request(build(leave, group_id=GROUP, members=(identity,)))
    assert answer.error_code == Errors.NONE


async def _all_heartbeating(generator: Generator, worker: Worker, rejoins_at_least: int) -> None:
    """The rejoins began, every member synced again, then a clean round of heartbeats answered."""
    await wait_until(lambda: sum(worker.rejoins.values()) >= rejoins_at_least, 10, f"{rejoins_at_least} rejoins")
    await wait_until(lambda: not any(m.rejoining for m in generator.members), 20, "every member synced again")
    worker.errors.clear()
    answered = worker.hist.total
    await wait_until(lambda: worker.hist.total >= answered + 10, 10, "heartbeats answered after the rejoin")
    assert not worker.errors, f"heartbeats answered with errors after the rejoin: {dict(worker.errors)}"


async def test_the_generator_rejoins_on_a_rebalance_and_after_being_removed() -> None:
    async with _server() as server:
        worker = Worker("127.0.0.1", server.port, [GROUP], 2, interval_s=0.1, session_ms=10_000,
                        members_per_connection=2, form_wave=2, connect_window=0)
        worker.measuring = True
        generator = Generator(worker)
        client = await KafkaClient.connect("127.0.0.1", server.port, client_id="test", timeout_ms=30_000)
        try:
            forming = await asyncio.wait_for(generator.start(), 20)
            assert forming["members"] == 2
            first_generation = max(m.generation for m in generator.members)

            # A third member joins: the group rebalances; it completes only once the generator's members rejoin
            # (otherwise after the 60-s rebalance timeout, past this bound).
            _, third = await asyncio.wait_for(
                join_and_sync(client, GROUP, worker, {}, {}, collections.Counter()), 20)
            assert worker.rejoins[Errors.REBALANCE_IN_PROGRESS] >= 2
            await _all_heartbeating(generator, worker, 2)
            assert all(m.generation > first_generation for m in generator.members)
            await _leave(client, third)  # and leaves again: one more rebalance the generator follows
            await _all_heartbeating(generator, worker, 4)

            removed = generator.members[0]
            old_id = removed.member_id
            await _leave(client, old_id)  # the coordinator forgets it: UNKNOWN_MEMBER_ID on its next heartbeat
            await wait_until(lambda: worker.rejoins[Errors.UNKNOWN_MEMBER_ID] >= 1, 10,
                             "a rejoin after UNKNOWN_MEMBER_ID")
            await _all_heartbeating(generator, worker, 6)
            assert removed.member_id not in ("", old_id)  # joined as a new member
            assert worker.rejoin_failures == 0, worker.rejoin_first_error
        finally:
            await client.close()
            await generator.stop()
