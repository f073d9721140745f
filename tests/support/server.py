"""The real GroupRuntime (in-memory store, real timer and clock) behind a real CoordinatorServer on a loopback
port, our client, and a raw-socket peer for sending bad bytes."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import struct
from typing import Any, Callable

from coordinator.config import CoordinatorConfig
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.server import CoordinatorServer, ServerConfig
from coordinator.timer import SystemTimer
from protocol.client import KafkaClient

FAST_GROUPS = CoordinatorConfig(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100)


class RunningServer:
    """`async with RunningServer() as env:` a coordinator and server on 127.0.0.1 and a free port."""

    def __init__(self, config: CoordinatorConfig = FAST_GROUPS, *,
                 front: Callable[[GroupRuntime], Any] | None = None, directory: Any = None,
                 authorizer: Any = None, **server_options: Any) -> None:
        """`front`: what the server is given in front of the runtime (tests/support/service_front.py), made of it;
        None: the runtime itself."""
        self.config = config
        self.authorizer = authorizer  # coordinator.security.authorizer.Authorizer: the ACLs enforced (None: none)
        self.front = front
        self.directory = directory
        self.server_config = ServerConfig(listen_host="127.0.0.1", listen_port=0, **server_options)
        self.clients: list[KafkaClient] = []

    async def __aenter__(self) -> RunningServer:
        self.timer = SystemTimer("test")
        self.timer.start()
        self.store = InMemoryGroupStore()
        self.coordinator = GroupRuntime(self.config, self.timer, self.store)
        self.service: Any = self.coordinator if self.front is None else self.front(self.coordinator)
        self.server = CoordinatorServer(self.server_config, self.service, on_shutdown=self._shutdown_groups,
                                        directory=self.directory, authorizer=self.authorizer)
        await self.server.start()
        return self

    async def _shutdown_groups(self) -> None:
        await self.coordinator.shutdown()
        await self.timer.close()

    async def __aexit__(self, *exc_info: object) -> None:
        for client in self.clients:
            if not client.is_closed:
                await client.close()
        await self.server.close()

    @property
    def port(self) -> int:
        return self.server.port

    async def client(self, **options: Any) -> KafkaClient:
        client = await KafkaClient.connect("127.0.0.1", self.port, **options)
        self.clients.append(client)
        return client

    async def raw(self) -> RawPeer:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        return RawPeer(reader, writer)


@dataclasses.dataclass
class RawPeer:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def closed_by_server(self, timeout_s: float = 5.0) -> bool:
        """True when the server closes the connection (EOF or reset) within the timeout."""
        try:
            data = await asyncio.wait_for(self.reader.read(65536), timeout_s)
            while data:
                data = await asyncio.wait_for(self.reader.read(65536), timeout_s)
            return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except asyncio.TimeoutError:
            return False

    async def read_frame(self, timeout_s: float = 5.0) -> bytes:
        size = struct.unpack(">i", await asyncio.wait_for(self.reader.readexactly(4), timeout_s))[0]
        return await asyncio.wait_for(self.reader.readexactly(size), timeout_s)

    def close(self) -> None:
        self.writer.close()


def read_frame_blocking(sock: socket.socket) -> bytes:
    """One size-prefixed Kafka frame from a blocking socket (ConnectionError if it closes first)."""
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


async def connected_sockets(env: RunningServer, count: int) -> list[socket.socket]:
    """`count` non-blocking sockets connected to `env`, returned once the server has made every connection
    (bounded: 10 s)."""
    loop = asyncio.get_running_loop()
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", env.port))
        socks.append(sock)
    for _ in range(2_000):
        if env.server.connection_count == count:
            return socks
        await asyncio.sleep(0.005)
    raise AssertionError(f"{env.server.connection_count} of {count} connections made")
