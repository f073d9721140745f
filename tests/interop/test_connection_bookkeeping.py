"""A closed connection leaves nothing in the server's books: through a real `CoordinatorServer` + `Relay` before the
real broker, short connections that ask the coordinator, relay a request upstream (each over a link of its own)
and close in every way a client does (after the answers, reset right after sending, mid-frame, before anything),
and once they are gone every structure the server keeps per connection is back where it was: the listener's
connection and in-flight sets, live connections, relay sides, upstream links, pending responses, transports,
tasks, the relay's buffer memory and (on asyncio's loop) the selector's file descriptors. Run on both loops the
service uses."""

from __future__ import annotations

import asyncio
import collections
import gc
import socket
import struct
from typing import Any

import pytest
import uvloop
from kio.schema.heartbeat.v4.request import HeartbeatRequest

from coordinator.relay.relay import Relay
from coordinator.server.listener import CoordinatorServer
from protocol.codec import encode_request
from tests.support.polling import wait_until
from tests.support.relayed_server import LIST_OFFSETS_NO_TOPICS, relayed_server
from tests.support.server import read_frame_blocking

pytestmark = pytest.mark.integration

CONNECTIONS = 400  # 100 of each way to close
PER_CONNECTION_TYPES = ("Connection", "RelaySide", "UpstreamLink", "PendingResponse", "LocalResponse",
                        "_SelectorSocketTransport", "TCPTransport", "memoryview")


def _frames(index: int) -> bytes:
    heartbeat = encode_request(0, "books", HeartbeatRequest(group_id=f"books-{index % 7}", generation_id=1,
                                                            member_id="m", group_instance_id=None))
    return heartbeat + struct.pack(">i", len(LIST_OFFSETS_NO_TOPICS)) + LIST_OFFSETS_NO_TOPICS


def _churn(port: int, count: int) -> None:
    """Blocking sockets in a thread, closing in turn: after both answers, reset after sending, mid-frame, empty."""
    for index in range(count):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            way = index % 4
            if way == 3:
                continue
            data = _frames(index)
            if way == 2:
                sock.sendall(data[:len(data) - 3])  # the relayed frame cut short: the reader holds a partial frame
                continue
            sock.sendall(data)
            if way == 1:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
                continue
            read_frame_blocking(sock)
            read_frame_blocking(sock)


def _books(server: CoordinatorServer, relay: Relay) -> dict[str, int]:
    gc.collect()
    live = collections.Counter(type(o).__name__ for o in gc.get_objects())
    books = {name: live[name] for name in PER_CONNECTION_TYPES}
    books["listener connections"] = server.connection_count
    books["listener in flight"] = len(server._busy)
    books["tasks"] = len(asyncio.all_tasks())
    books["relay buffer bytes in use"] = relay.pool.stats().used_bytes
    selector: Any = getattr(asyncio.get_running_loop(), "_selector", None)
    if selector is not None:  # asyncio's loop: every registered file descriptor
        books["selector fds"] = len(selector.get_map())
    return books


async def _churn_and_compare(kafka_bootstrap: str) -> None:
    async with relayed_server(kafka_bootstrap, "books") as env:
        server, relay = env.server, env.relay
        await asyncio.to_thread(_churn, env.broker_port, 8)  # first use: imports, caches, the relay's metadata
        baseline = await _settled(server, relay)
        assert baseline["listener connections"] == 0
        relayed_before = relay.counters.requests
        await asyncio.wait_for(asyncio.to_thread(_churn, env.broker_port, CONNECTIONS), 120)
        assert relay.counters.requests - relayed_before >= CONNECTIONS // 4  # links were opened and used
        after = await _settled(server, relay)
        kept = {name: (baseline[name], count) for name, count in after.items() if count != baseline[name]}
        assert not kept, f"kept after {CONNECTIONS} closed connections (baseline, now): {kept}"


async def _settled(server: CoordinatorServer, relay: Relay) -> dict[str, int]:
    """The books once every connection is gone and two looks 0.2 s apart agree (closes finish over a few loop
    iterations: cancelled tasks, connection_lost)."""
    await wait_until(lambda: server.connection_count == 0, 30, "every connection closed")
    previous: dict[str, int] = {}
    for _ in range(50):
        current = _books(server, relay)
        if current == previous:
            return current
        previous = current
        await asyncio.sleep(0.2)
    raise AssertionError(f"the books never settled: {previous}")


async def test_closed_connections_leave_nothing_in_the_books(kafka_bootstrap: str) -> None:
    await _churn_and_compare(kafka_bootstrap)


def test_closed_connections_leave_nothing_in_the_books_on_uvloop(kafka_bootstrap: str) -> None:
    uvloop.run(_churn_and_compare(kafka_bootstrap))  # the service's default loop
