"""The soak generator's forming waves wait for the server's accepts: at most `connect_window` connections are
opened and not yet answered, so a wave larger than the listen queue (somaxconn) does not overflow it."""
from __future__ import annotations

import asyncio
import contextlib
import socket
import time

from bench.soak import Worker, form
from protocol.client import KafkaClient


def _queued(listener: socket.socket, held: list[socket.socket]) -> int:
    """Connections the kernel completed and nobody accepted yet; accepted now and held open, never answered."""
    count = 0
    while True:
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            return count
        held.append(connection)
        count += 1


async def _connections_waiting(window: int, members: int = 12) -> int:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)  # room for every member: only the window can hold them back
    listener.setblocking(False)
    worker = Worker("127.0.0.1", listener.getsockname()[1], ["g"], members, 10.0, 30_000, 10, members, window)
    forming = asyncio.get_running_loop().create_task(form(worker, lambda *_: None, KafkaClient))
    held: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 10
        waiting = 0
        while waiting < min(window or members, members):  # a server that never answers: the queue fills
            assert time.monotonic() < deadline, f"only {waiting} connections arrived"
            await asyncio.sleep(0.05)
            waiting += _queued(listener, held)
        await asyncio.sleep(0.5)  # more would have arrived by now without the window
        return waiting + _queued(listener, held)
    finally:
        forming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await forming
        for connection in held:
            connection.close()
        listener.close()


async def test_no_more_connections_wait_to_be_accepted_than_the_window() -> None:
    assert await _connections_waiting(window=3) == 3


async def test_without_a_window_the_whole_wave_connects_at_once() -> None:
    assert await _connections_waiting(window=0) == 12
