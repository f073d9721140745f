"""On asyncio the service's loop reads a bounded number of ready connections per turn (coordinator/server/event_loop.py):
a turn's reads do not grow with the connections that became readable together. (asyncio's own loop reads every
readable connection in the same turn: 512 ready, 512 reads in one turn.) Every connection is still read and
answered: a connection left for a later turn is not starved.

A real CoordinatorServer + GroupRuntime (in-memory store) on the loop `coordinator serve --event-loop asyncio` runs,
raw client sockets sending a Heartbeat v4 each in one callback (so all are readable at the server's next poll); a
ticker rescheduled every turn splits the server's reads by the turn that made them."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest

from coordinator import cli
from coordinator.server import event_loop
from coordinator.server.connection import Connection
from protocol import codec
from tests.support.server import RunningServer, connected_sockets
from tests.support.wire import heartbeat

_V4_ANSWER_BYTES = 16  # size prefix, correlation id, throttle time, error code, tag bytes


async def _answered(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while len(data) < _V4_ANSWER_BYTES:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 4_096), 10)
        assert chunk, "the server closed the connection"
        data += chunk
    return data


async def _server_reads_per_turn(connections: int) -> list[int]:
    """The server's reads of each loop turn while `connections` peers, readable together, are read once each."""
    per_turn = [0]
    read = Connection.buffer_updated

    def counted(self: Connection, nbytes: int) -> None:
        per_turn[-1] += 1
        read(self, nbytes)

    async with RunningServer() as env:
        socks = await connected_sockets(env, connections)
        loop = asyncio.get_running_loop()

        def tick() -> None:
            if per_turn[-1]:
                per_turn.append(0)
            ticker[0] = loop.call_soon(tick)

        ticker = [loop.call_soon(tick)]
        Connection.buffer_updated = counted  # type: ignore[method-assign]
        try:
            frame = codec.encode_request(7, "t", heartbeat("g", 1, "unknown-member"))
            for sock in socks:  # in one callback: every connection is readable at the server's next poll
                sock.send(frame)
            answers = await asyncio.gather(*(_answered(sock) for sock in socks))
        finally:
            Connection.buffer_updated = read  # type: ignore[method-assign]
            ticker[0].cancel()
            for sock in socks:
                sock.close()
    assert len(answers) == connections and all(len(a) == _V4_ANSWER_BYTES for a in answers)
    assert sum(per_turn) == connections, per_turn  # every connection read, once
    return per_turn


def _run(make_loop: Callable[[], asyncio.AbstractEventLoop], connections: int) -> list[int]:
    with asyncio.Runner(loop_factory=make_loop) as runner:
        return runner.run(_server_reads_per_turn(connections))


def test_the_service_loop_reads_at_most_its_events_per_poll_whatever_the_connections_ready() -> None:
    bound = event_loop.EVENTS_PER_POLL
    few = _run(event_loop.new_event_loop, bound // 2)
    many = _run(event_loop.new_event_loop, 4 * bound)
    assert max(few) == bound // 2, few  # fewer than the bound: all in one turn, as before
    assert max(many) <= bound, many  # 4x the connections ready: no more reads in a turn
    assert len([n for n in many if n]) >= 4, many


@pytest.mark.parametrize("events_per_poll", [1, 16])
def test_a_smaller_bound_spreads_the_reads_over_more_turns(events_per_poll: int) -> None:
    per_turn = _run(lambda: event_loop.new_event_loop(events_per_poll), 96)
    assert max(per_turn) <= events_per_poll, per_turn


def test_the_command_line_runs_asyncio_on_the_bounded_loop() -> None:
    async def selector_bound() -> int:
        return asyncio.get_running_loop()._selector.max_events  # type: ignore[attr-defined]

    assert cli._run(selector_bound(), "asyncio") == event_loop.EVENTS_PER_POLL
