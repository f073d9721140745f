"""A group leader's SyncGroup goes ahead of the requests left for a later loop turn (coordinator/server/turns.py):
every parked member's answer waits for the assignment it carries, and requests of different connections have no
order to keep (Kafka's request handler threads take them as they come). Each connection's own frames keep theirs."""

from __future__ import annotations

import asyncio
from typing import Any

import uvloop

from coordinator.config import CoordinatorConfig
from coordinator.group.api import JoinGroupResponse, SyncGroupRequest
from coordinator.server.handlers.join_group import answered_as_leader
from coordinator.server.turns import REQUEST_UNITS, turn_budget
from protocol import codec
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from protocol.group_fastpath import pack_sync_group_request
from tests.support.server import RunningServer
from tests.support.service_front import ServiceFront
from tests.support.wire import join, join_with_member_id, sync

# every member joins the first generation within the initial delay
_CONFIG = CoordinatorConfig(group_initial_rebalance_delay_ms=300, group_min_session_timeout_ms=100)
_MEMBERS = 300


class _SyncOrder(ServiceFront):
    """Notes the member of every SyncGroup in the order group logic is given them, and how many connections were
    waiting for a later turn when the one carrying assignments came."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.synced: list[str] = []
        self.waiting_at_assignment = -1

    def start_sync_group(self, req: SyncGroupRequest) -> Any:
        self.synced.append(req.member_id)
        if req.assignments:
            self.waiting_at_assignment = turn_budget().waiting
        return self.runtime.start_sync_group(req)


async def _stable_group(clients: list[KafkaClient]) -> list[str]:
    joined = await asyncio.gather(*(join_with_member_id(c, "g") for c in clients))
    assert {j.error_code for j in joined} == {0} and len({j.generation_id for j in joined}) == 1
    leader = next(j for j in joined if j.leader == j.member_id)
    await asyncio.gather(*(sync(c, "g", j.generation_id, j.member_id,
                                {m.member_id: b"a" for m in j.members} if j is leader else None)
                           for c, j in zip(clients, joined)))
    return [j.member_id for j in joined]


async def test_the_leaders_sync_group_is_handled_ahead_of_the_followers_left_for_later_turns() -> None:
    async with RunningServer(_CONFIG, front=_SyncOrder) as env:
        runtime: Any = env.service
        per_turn = turn_budget().per_turn // REQUEST_UNITS
        assert _MEMBERS > 2 * per_turn
        clients = [await env.client() for _ in range(_MEMBERS)]
        try:
            member_ids = await _stable_group(clients)
            # a rebalance: everyone rejoins with new metadata; the join completes when the last has
            joined = await asyncio.gather(*(join(c, "g", m, topics=("u",)) for c, m in zip(clients, member_ids)))
            assert {j.error_code for j in joined} == {0}
            leader = next(j for j in joined if j.leader == j.member_id)
            runtime.synced = []
            # the followers' SyncGroups first, the leader's last (it ran its assignor), all in one callback: the
            # server reads them in one turn and leaves all but a turn's budget for later turns
            order = [j for j in joined if j is not leader] + [leader]
            answers = []
            for j in order:
                client = clients[joined.index(j)]
                correlation_id = client.next_correlation_id()
                assignments = [(m.member_id, m.member_id.encode()) for m in leader.members] if j is leader else []
                frame = pack_sync_group_request(5, correlation_id, client.client_id, "g", j.generation_id,
                                                j.member_id, None, "consumer", "range", assignments)
                answers.append(client.send_raw(frame, correlation_id, ApiKey.SYNC_GROUP, 5, timeout_ms=10_000))
            synced = [codec.decode_response(ApiKey.SYNC_GROUP, 5, raw)[1]
                      for raw in await asyncio.wait_for(asyncio.gather(*answers), 20)]
        finally:
            for client in clients:
                await client.close()
        assert [(s.error_code, s.assignment) for s in synced] == [(Errors.NONE, j.member_id.encode()) for j in order]
        assert sorted(runtime.synced) == sorted(member_ids)
        # first in the turn after the one that read it, ahead of the followers still waiting (the leader's came
        # last: behind them all without the change)
        assert runtime.waiting_at_assignment > 0
        assert runtime.synced.index(leader.member_id) <= _MEMBERS - per_turn, runtime.synced.index(leader.member_id)
        assert turn_budget().waiting == 0


def test_a_join_answer_names_its_leader() -> None:
    assert answered_as_leader(JoinGroupResponse(Errors.NONE, member_id="m", leader="m"))
    assert not answered_as_leader(JoinGroupResponse(Errors.NONE, member_id="f", leader="m"))
    assert not answered_as_leader(JoinGroupResponse(Errors.REBALANCE_IN_PROGRESS, member_id="", leader=""))


def test_the_leaders_sync_group_goes_first_on_uvloop() -> None:
    uvloop.run(test_the_leaders_sync_group_is_handled_ahead_of_the_followers_left_for_later_turns())
