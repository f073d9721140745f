"""A relayed connection leaves nothing behind for the cyclic collector, on asyncio and on uvloop.

The service's GC policy (coordinator/runtime_health.py) freezes whatever survives two young collections, so a
reference cycle that was alive then is never freed. Relayed connections were such cycles (the client
connection and its upstream link pointing at each other, the link and its cancelled connect task, CPython
3.11's selector transport and its own bound method): under connection churn the relay's RSS grew by ~90 bytes
per connection on average (docs/protocol.md). Here every kind of relayed connection is made with the collector
off, through a real `CoordinatorServer` + `Relay` in front of the real broker: a relayed request answered,
one abandoned before its answer (the link torn down mid-flight, its connect possibly still pending), a local
request, garbage, and then the mutation fuzzer (tests/fuzz) from another process. Afterwards no connection,
link, reader or transport may be found by the collector: reference counting alone must have freed them all.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import struct
import sys
from pathlib import Path

import pytest
import uvloop

from coordinator.config import CoordinatorConfig
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.relay.config import RelayConfig
from coordinator.relay.relay import Relay
from coordinator.relay.upstream import PendingResponse, UpstreamLink
from coordinator.server import ServerConfig
from coordinator.server.connection import Connection
from coordinator.server.context import ConnectionContext
from coordinator.server.handlers import served_ranges
from coordinator.server.relaying import LocalResponse, RelaySide
from coordinator.server.listener import CoordinatorServer
from coordinator.timer import SystemTimer
from protocol.framing import FrameReader
from tests.support.polling import wait_until
from tests.support.server import read_frame_blocking

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 40  # of the five explicit kinds below: 200 connections
FUZZ_FRAMES = 3_000  # ~900 connections of every kind the fuzzer makes
FUZZ_CORPUS = "0:3-9,1:4-15,2:1-10,3:0-12,18:0-4,10:0-4,11:0-9,12:0-4,14:0-5"
CONNECTION_TYPES = (Connection, RelaySide, UpstreamLink, PendingResponse, LocalResponse, FrameReader,
                    ConnectionContext)


def _frame(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    client_id = b"cycles"
    payload = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id + body
    return struct.pack(">i", len(payload)) + payload


API_VERSIONS = _frame(18, 0, 1)
METADATA_NO_TOPICS = _frame(3, 1, 2, struct.pack(">i", 0))  # relayed (rewritten) to the broker


def _churn(port: int) -> None:
    """Blocking sockets in a thread: nothing cyclic of the client's own in this process."""
    for _ in range(ROUNDS):
        for send, answers in ((METADATA_NO_TOPICS, 1), (METADATA_NO_TOPICS, 0), (API_VERSIONS + METADATA_NO_TOPICS, 2),
                              (API_VERSIONS, 1), (METADATA_NO_TOPICS + b"\x7f\xff\xff\xff garbage", 0)):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(send)
                for _ in range(answers):
                    read_frame_blocking(sock)


async def _fuzz(port: int) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fuzz", "--target", f"127.0.0.1:{port}", "--no-control", "--corpus",
        FUZZ_CORPUS, "--frames", str(FUZZ_FRAMES), "--seed", "21", "--waves", "1",
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode == 0, stderr.decode()[-2_000:]


async def _left_in_cycles(bootstrap: str) -> tuple[list[str], int]:
    """Type names of connection objects only the cyclic collector found, and requests relayed upstream."""
    timer = SystemTimer("cycles")
    timer.start()
    coordinator = GroupRuntime(CoordinatorConfig(group_initial_rebalance_delay_ms=0), timer, InMemoryGroupStore())
    relay = Relay(RelayConfig(), bootstrap, served=served_ranges(), max_frame_bytes=ServerConfig().max_frame_bytes)
    server = CoordinatorServer(ServerConfig(listen_port=0, node_id=2_000_000_000, shutdown_grace_ms=1_000),
                               coordinator, relay=relay)
    await server.start()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # everything a collection finds unreachable lands in gc.garbage
    try:
        assert relay.listeners is not None
        broker_port = relay.listeners.port_of(min(relay.brokers))
        assert broker_port is not None
        await asyncio.to_thread(_churn, broker_port)
        await asyncio.to_thread(_churn, server.port)  # the bootstrap listener relays too
        await _fuzz(broker_port)
        await wait_until(lambda: server.connection_count == 0, 30, "every connection closed")
        for _ in range(20):  # cancelled connect tasks and lost connections finish on the next iterations
            await asyncio.sleep(0.01)
        gc.collect()
        cyclic = sorted({type(o).__name__ for o in gc.garbage
                         if isinstance(o, CONNECTION_TYPES) or type(o).__name__.endswith("Transport")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        await server.close()
        await coordinator.shutdown()
        await timer.close()
    return cyclic, relay.counters.requests


async def test_relayed_connections_are_freed_without_the_cyclic_collector(kafka_bootstrap: str) -> None:
    cyclic, relayed = await _left_in_cycles(kafka_bootstrap)
    assert relayed >= 3 * ROUNDS * 2  # the links were really opened and used
    assert cyclic == [], f"freed only by the cyclic collector (leaked once frozen): {cyclic}"


def test_relayed_connections_are_freed_without_the_cyclic_collector_on_uvloop(kafka_bootstrap: str) -> None:
    cyclic, relayed = uvloop.run(_left_in_cycles(kafka_bootstrap))
    assert relayed >= 3 * ROUNDS * 2
    assert cyclic == [], f"freed only by the cyclic collector (leaked once frozen): {cyclic}"
