"""Stopping the server with many connections is not one long loop callback (coordinator/server/listener.py):
connections are paused, then closed, a batch per loop turn, and the stop stays complete: the shutdown hook runs,
every connection is closed (each peer reads its EOF) and forgotten.

Before, `coordinator serve` with 3,334 connections paused and closed them all in one callback of the stopping
task; here a ticker rescheduled every turn splits the pauses and closes by the turn that made them."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
import uvloop

from coordinator.server import listener
from coordinator.server.connection import Connection
from tests.support.server import RunningServer, connected_sockets

_BATCH = 40


async def _eof(sock: socket.socket) -> bytes:
    """What the peer reads until the server's close."""
    loop = asyncio.get_running_loop()
    data = b""
    while chunk := await asyncio.wait_for(loop.sock_recv(sock, 4_096), 10):
        data += chunk
    return data


async def test_connections_are_paused_and_closed_a_batch_per_turn_and_all_of_them_closed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    connections = 6 * _BATCH
    monkeypatch.setattr(listener, "_CLOSE_BATCH", _BATCH, raising=False)  # (raising: the test runs on the old code too)
    # Each loop turn, the connections paused and closed in it: read from their state (a class's methods replaced
    # would not be seen by the compiled listener's calls)
    turns: list[dict[str, int]] = []
    states: dict[str, Callable[[Connection], bool]] = {"stop_reading": lambda connection: connection._reading_paused,
                                                       "close": lambda connection: not connection.is_open}
    seen = dict.fromkeys(states, 0)

    hook_ran = asyncio.Event()
    env = RunningServer()
    async with env:
        socks = await connected_sockets(env, connections)
        served = list(env.server._connections)
        shutdown = env.server._on_shutdown
        assert shutdown is not None

        async def hook() -> None:
            await shutdown()
            hook_ran.set()

        env.server._on_shutdown = hook
        loop = asyncio.get_running_loop()

        def tick() -> None:
            turn = {}
            for name, state in states.items():
                now = sum(1 for connection in served if state(connection))
                turn[name], seen[name] = now - seen[name], now
            turns.append(turn)
            ticker[0] = loop.call_soon(tick)

        ticker = [loop.call_soon(tick)]
        try:
            eofs = asyncio.gather(*(_eof(sock) for sock in socks))
            await env.server.close()
            assert await eofs == [b""] * connections  # every peer's connection closed by the server
        finally:
            ticker[0].cancel()
            for sock in socks:
                sock.close()
        for _ in range(1_000):  # every connection forgotten (its connection_lost ran; bounded)
            if env.server.connection_count == 0:
                break
            await asyncio.sleep(0.005)
    assert hook_ran.is_set()
    assert env.server.connection_count == 0
    for name in states:
        per_turn = [turn.get(name, 0) for turn in turns]
        assert sum(per_turn) == connections, (name, per_turn)
        assert max(per_turn) <= _BATCH, (name, per_turn)  # before: every connection in one turn


def test_connections_closed_a_batch_per_turn_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    uvloop.run(test_connections_are_paused_and_closed_a_batch_per_turn_and_all_of_them_closed(monkeypatch))
