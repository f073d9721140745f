"""A connection whose buffer holds exactly one whole Heartbeat v4 request, nothing parked or paused, answers it
from `buffer_updated` (or, when the turn's budget was spent, from `continue_frames` in a later turn) with one write
(Connection._sole_frame): the same answer as the frame loop's, the member's session moved; everything else
(pipelined frames, part of a frame, an unusual shape, a failing handler) goes the general way with its usual
outcome."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from coordinator.group.runtime import GroupRuntime
from coordinator.server.config import ServerConfig
from coordinator.server.connection import Connection
from coordinator.server.context import Node
from coordinator.server.turns import HEARTBEAT_UNITS, REQUEST_UNITS, turn_budget
from protocol.error_codes import Errors
from protocol.fastpath import pack_heartbeat_request, pack_heartbeat_response
from tests.support.connection_wire import RecordingTransport, receive, stable_group_runtime
from tests.support.service_front import ServiceFront

MEMBERS = ("m-0", "m-1")
SESSION_MS = 30_000


@pytest.fixture
async def runtime() -> Any:
    async with stable_group_runtime(MEMBERS, SESSION_MS) as runtime:
        yield runtime


def _connected(runtime: GroupRuntime, config: ServerConfig = ServerConfig(),
               service: Any = None) -> tuple[Connection, RecordingTransport]:
    """A connection to `runtime` (or to `service` in front of it); its `frame_loop_rounds` count the frame
    loop's rounds."""
    host = SimpleNamespace(config=config, relay=None, directory=None,
                           coordinator=runtime if service is None else service,
                           clock=runtime.clock, node=Node(0, "127.0.0.1", 9092, "test"), closing=False,
                           authorizer=None, admit=lambda _c: True, forget=lambda _c: None,
                           parked=lambda _c: None, unparked=lambda _c: None)
    connection = Connection(host)  # type: ignore[arg-type]
    wire = RecordingTransport()
    connection.connection_made(wire)  # type: ignore[arg-type]
    return connection, wire


def _heartbeat(correlation_id: int, member_id: str = MEMBERS[0], generation_id: int = 1) -> bytes:
    return pack_heartbeat_request(4, correlation_id, "client", "g", generation_id, member_id)


def _answer(correlation_id: int, error: Errors = Errors.NONE) -> bytes:
    return pack_heartbeat_response(4, correlation_id, error)


async def test_a_read_of_one_heartbeat_is_answered_with_one_write_without_the_frame_loop(runtime: Any) -> None:
    connection, wire = _connected(runtime)
    member = runtime.shard_for("g").groups["g"].members[MEMBERS[0]]
    runtime.clock.advance(5_000)
    receive(connection, _heartbeat(7))
    assert wire.writes == [_answer(7)]
    assert connection.frame_loop_rounds == 0
    assert member.heartbeat_deadline_ms == runtime.clock.now_ms() + SESSION_MS  # the session moved
    assert connection.buffered_bytes == 0


@pytest.mark.parametrize(("member_id", "generation_id", "error"), [
    ("stranger", 1, Errors.UNKNOWN_MEMBER_ID), (MEMBERS[1], 9, Errors.ILLEGAL_GENERATION)])
async def test_errors_are_answered_on_the_direct_path_as_on_the_general_one(runtime: Any, member_id: str,
                                                                            generation_id: int, error: Errors) -> None:
    connection, wire = _connected(runtime)
    receive(connection, _heartbeat(3, member_id, generation_id))
    receive(connection, _heartbeat(4, member_id, generation_id) + _heartbeat(5, member_id, generation_id))
    assert wire.writes == [_answer(3, error), _answer(4, error) + _answer(5, error)]
    assert connection.frame_loop_rounds == 1  # the pipelined pair only


async def test_pipelined_frames_take_the_frame_loop_and_a_split_one_is_answered_once_whole(runtime: Any) -> None:
    connection, wire = _connected(runtime)
    frames = _heartbeat(1) + _heartbeat(2, MEMBERS[1])
    receive(connection, frames)
    assert wire.writes == [_answer(1) + _answer(2)]  # one write for the read's answers
    assert connection.frame_loop_rounds == 1
    split = _heartbeat(3)
    receive(connection, split[:5])
    assert wire.writes[1:] == [] and connection.frame_loop_rounds == 2  # the loop finds no whole frame
    receive(connection, split[5:])  # now the one whole frame buffered: the direct path
    assert wire.writes[1:] == [_answer(3)] and connection.frame_loop_rounds == 2
    receive(connection, _heartbeat(4))
    assert wire.writes[2:] == [_answer(4)] and connection.frame_loop_rounds == 2


async def test_a_heartbeat_in_an_unusual_shape_is_answered_by_the_general_path(runtime: Any) -> None:
    connection, wire = _connected(runtime)
    frame = bytearray(_heartbeat(11))
    frame[-1] = 1  # one body tag (an unknown one: tag 9, empty), which the hand reader leaves to the decoder
    frame += b"\x09\x00"
    frame[:4] = (len(frame) - 4).to_bytes(4, "big")
    budget = turn_budget()
    left = budget.left
    receive(connection, bytes(frame))
    assert wire.writes == [_answer(11)]
    # the general path's decoder took it (a request's units; the hand reader's path costs a heartbeat's), its
    # answer sent without the frame loop: nothing else was buffered
    assert left - budget.left == REQUEST_UNITS and HEARTBEAT_UNITS != REQUEST_UNITS
    assert connection.frame_loop_rounds == 0


async def test_with_the_turn_budget_spent_the_heartbeat_waits_for_the_next_turn(runtime: Any) -> None:
    connection, wire = _connected(runtime)
    budget = turn_budget()
    budget.spend(budget.left)
    receive(connection, _heartbeat(21))
    assert wire.writes == [] and connection.buffered_bytes > 0
    for _ in range(10):  # the refill runs in a later turn (bounded)
        await asyncio.sleep(0)
        if wire.writes:
            break
    assert wire.writes == [_answer(21)]
    assert connection.frame_loop_rounds == 0  # waited without the frame loop, answered directly in the later turn


async def test_reads_waiting_for_the_next_turn_stop_at_max_buffered_bytes_and_resume_once_handled(
        runtime: Any) -> None:
    connection, wire = _connected(runtime, ServerConfig(max_buffered_bytes=3 * len(_heartbeat(0))))
    budget = turn_budget()
    budget.spend(budget.left)
    for correlation_id in range(3):  # each read waits for the next turn, the third reaches the bound
        assert wire.reading
        receive(connection, _heartbeat(correlation_id))
    assert not wire.reading and wire.writes == []
    for _ in range(10):  # the refill runs in a later turn (bounded)
        await asyncio.sleep(0)
        if wire.writes:
            break
    assert wire.writes == [_answer(0) + _answer(1) + _answer(2)] and wire.reading


async def test_a_failing_handler_closes_the_connection_with_one_log_line_and_no_answer(
        runtime: Any, caplog: pytest.LogCaptureFixture) -> None:
    class Broken(ServiceFront):
        def handle_heartbeat(self, *_args: Any) -> Errors:
            raise RuntimeError("bug")

    connection, wire = _connected(runtime, service=Broken(runtime))
    with caplog.at_level(logging.WARNING, logger="coordinator.server"):
        receive(connection, _heartbeat(31))
    assert wire.writes == [] and wire.aborted and not connection.is_open
    assert [r.getMessage().split()[0] for r in caplog.records] == ["event=handler_failed", "event=connection_closed"]
    assert "correlation_id=31" in caplog.records[0].getMessage()
