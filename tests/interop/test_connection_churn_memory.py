"""Connection churn leaves no memory behind: through a real `CoordinatorServer` + `Relay` in front of the real
broker, each connection asks about a group id of its own (as a fuzzer or a misbehaving client does), relays a
request upstream over its own link, and closes in one of three ways (after the answers, right after sending,
or before anything); after a warm-up, what the server process still holds (tracemalloc, the cyclic collector
off so cyclic garbage counts as held, as it would once the GC policy froze it) must not grow with the
connections (it grows by ~2 bytes per connection once warm, most of it asyncio's own bookkeeping)."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import struct
import tracemalloc

import pytest
import uvloop
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.offset_fetch.v8.request import OffsetFetchRequest, OffsetFetchRequestGroup

from coordinator.server.listener import CoordinatorServer
from protocol.codec import encode_request
from tests.support.polling import wait_until
from tests.support.relayed_server import LIST_OFFSETS_NO_TOPICS, relayed_server
from tests.support.server import read_frame_blocking

pytestmark = pytest.mark.integration

WARM_UP = 2_000  # untraced; then TRACED_WARM_UP more, traced, before the measured phase
TRACED_WARM_UP = 2_000  # structures that fill once (fd-indexed maps, pool free lists) fill here
MEASURED = 6_000
BOUND_BYTES_PER_CONNECTION = 8  # measured 1.9; the partition cache alone kept ~70 B per invented group id


def _frames(run: str, index: int) -> tuple[bytes, int]:
    group_id = f"churn-{run}-{index:08d}"  # new in every run: an id asked about again later would be cached
    requests = [HeartbeatRequest(group_id=group_id, generation_id=1, member_id="m", group_instance_id=None),
                OffsetFetchRequest(groups=(OffsetFetchRequestGroup(group_id=group_id, topics=None),),
                                   require_stable=False),
                DescribeGroupsRequest(groups=(group_id,), include_authorized_operations=False)]
    data = b"".join(encode_request(correlation_id, "churn", body) for correlation_id, body in enumerate(requests))
    relayed = struct.pack(">i", len(LIST_OFFSETS_NO_TOPICS)) + LIST_OFFSETS_NO_TOPICS
    return data + relayed, len(requests) + 1


def _churn(port: int, first: int, count: int, run: str) -> None:
    """Blocking sockets in a thread; every third connection answered in full, reset after sending, or empty."""
    for index in range(first, first + count):
        data, answers = _frames(run, index)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            if index % 3 == 2:
                continue
            sock.sendall(data)
            if index % 3 == 1:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
                continue
            for _ in range(answers):
                read_frame_blocking(sock)


async def _settle(server: CoordinatorServer) -> None:
    await wait_until(lambda: server.connection_count == 0, 30, "every connection closed")
    for _ in range(20):  # cancelled connect tasks and lost connections finish on the next iterations
        await asyncio.sleep(0.01)


async def _held_per_connection(kafka_bootstrap: str) -> tuple[float, int]:
    """Bytes still held per measured connection, and requests relayed upstream while measuring."""
    run = os.urandom(4).hex()
    async with relayed_server(kafka_bootstrap, "churn") as env:
        server, relay, broker_port = env.server, env.relay, env.broker_port
        await asyncio.to_thread(_churn, broker_port, 0, WARM_UP, run)  # caches, pools and first-use imports fill
        await _settle(server)
        relayed_before = relay.counters.requests
        gc.collect()
        gc.disable()
        tracemalloc.start()
        try:
            await asyncio.wait_for(asyncio.to_thread(_churn, broker_port, WARM_UP, TRACED_WARM_UP, run), 300)
            await _settle(server)
            before = tracemalloc.get_traced_memory()[0]
            measured = asyncio.to_thread(_churn, broker_port, WARM_UP + TRACED_WARM_UP, MEASURED, run)
            await asyncio.wait_for(measured, 600)
            await _settle(server)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            gc.enable()
        return grown / MEASURED, relay.counters.requests - relayed_before


async def test_memory_held_does_not_grow_with_churned_connections(kafka_bootstrap: str) -> None:
    per_connection, relayed = await _held_per_connection(kafka_bootstrap)
    assert relayed >= MEASURED // 3  # the links were really opened and used
    assert per_connection < BOUND_BYTES_PER_CONNECTION, f"{per_connection:.1f} bytes held per churned connection"


def test_memory_held_does_not_grow_with_churned_connections_on_uvloop(kafka_bootstrap: str) -> None:
    per_connection, relayed = uvloop.run(_held_per_connection(kafka_bootstrap))  # the service's default loop
    assert relayed >= MEASURED // 3
    assert per_connection < BOUND_BYTES_PER_CONNECTION, f"{per_connection:.1f} bytes held per churned connection"
