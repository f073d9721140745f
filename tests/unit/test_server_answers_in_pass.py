"""A rebalance's parked JoinGroups and SyncGroups are answered in group logic's pass (`ANSWERED_IN_PASS`,
coordinator/group/member.py): the connection waiting for each writes its answer in the very call that completes
the member's request, no loop callback per member. What waited behind such an answer on its connection is handled
only once the pass is over: a SyncGroup pipelined behind a JoinGroup must not reach the group while the join's
answers are still being given (the member would not be owed a SyncGroup yet, and would stay owed one)."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from coordinator.group.member import ANSWERED_IN_PASS
from coordinator.server.config import ServerConfig
from coordinator.server.listener import CoordinatorServer
from protocol.error_codes import Errors
from protocol.group_fastpath import pack_sync_group_request
from tests.support.connection_wire import connected, join_frame, receive, stable_group_runtime, within_loop_turns

MEMBERS = ("m-0", "m-1", "m-2")  # m-0 leads
SESSION_MS = 30_000


@pytest.fixture
async def runtime() -> Any:
    async with stable_group_runtime(MEMBERS, SESSION_MS) as runtime:
        yield runtime


def _sync(correlation_id: int, member_id: str, generation: int, assignments: list[tuple[str, bytes]]) -> bytes:
    return pack_sync_group_request(5, correlation_id, "client", "g", generation, member_id, None, "consumer", "range",
                                   assignments)


def _error_and_generation(answer: bytes) -> tuple[int, int]:
    """A JoinGroup v9 answer's error code and generation (size, correlation id, tags, throttle first)."""
    error, generation = struct.unpack_from(">hi", answer, 13)
    return error, generation


async def test_the_joins_parked_answers_are_written_in_the_call_that_completes_the_join(runtime: Any) -> None:
    server = CoordinatorServer(ServerConfig(), runtime)
    (leader, leader_wire), (second, second_wire), (last, last_wire) = (connected(server) for _ in MEMBERS)
    receive(leader, join_frame(1, MEMBERS[0]))  # a rebalance: both park until every member has rejoined
    receive(second, join_frame(1, MEMBERS[1]))
    assert leader.is_busy and second.is_busy and len(ANSWERED_IN_PASS) == 2
    receive(last, join_frame(1, MEMBERS[2]))  # the join completes here
    # no loop turn since: every answer already written (the last member's own at once, as before)
    assert [_error_and_generation(w) for wire in (leader_wire, second_wire, last_wire) for w in wire.writes] \
        == [(Errors.NONE, 2)] * 3
    assert not leader.is_busy and not second.is_busy and not ANSWERED_IN_PASS
    assert server._all_idle.is_set()


async def test_a_sync_pipelined_behind_a_join_reaches_the_group_only_after_the_joins_answers(runtime: Any) -> None:
    server = CoordinatorServer(ServerConfig(), runtime)
    (leader, leader_wire), (second, second_wire), (last, last_wire) = (connected(server) for _ in MEMBERS)
    receive(leader, join_frame(1, MEMBERS[0]))  # the leader rejoins: a rebalance
    receive(second, join_frame(1, MEMBERS[1]) + _sync(2, MEMBERS[1], 2, []))  # its SyncGroup waits behind the join
    receive(last, join_frame(1, MEMBERS[2]))  # the join completes: m-1's answer given in the pass, its SyncGroup after
    group = runtime.groups["g"]
    assert MEMBERS[1] in group.pending_sync_members and second.buffered_bytes > 0  # not handled inside the pass
    await within_loop_turns(lambda: not second.buffered_bytes)
    assert second.is_busy and MEMBERS[1] not in group.pending_sync_members  # parked, owing nothing
    receive(last, _sync(2, MEMBERS[2], 2, []))
    receive(leader, _sync(2, MEMBERS[0], 2, [(m, m.encode()) for m in MEMBERS]))
    await within_loop_turns(lambda: all(len(wire.writes) == 2 for wire in (second_wire, last_wire, leader_wire)))
    assert not group.pending_sync_members and group.state.value == "Stable"
    for member, wire in zip(MEMBERS, (leader_wire, second_wire, last_wire)):
        assert _error_and_generation(wire.writes[0]) == (Errors.NONE, 2)
        assert wire.writes[1].endswith(member.encode() + b"\x00")  # its assignment, then the tag section
        assert struct.unpack_from(">h", wire.writes[1], 13)[0] == Errors.NONE

