"""Shared by the server tests: the real GroupRuntime (in-memory store, real timer and clock) behind a real
CoordinatorServer on a loopback port, our client, and a raw-socket peer for sending bad bytes.
(It holds no tests itself.)"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import struct
from typing import Any

from coordinator.config import CoordinatorConfig
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.server import CoordinatorServer, ServerConfig
from coordinator.timer import SystemTimer
from protocol import apis
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.consumer_protocol import Subscription, encode_subscription
from protocol.messages import build, item_class

SESSION_MS = 6_000
FAST_GROUPS = CoordinatorConfig(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100)


def request(api_key: int, version: int, **fields: Any) -> Any:
    """A kio request of any version from one set of values (fields the version lacks are dropped)."""
    return build(apis.request_class(api_key, version), **fields)


def nested(api_key: int, version: int, *path: str) -> type:
    cls = apis.request_class(api_key, version)
    for name in path:
        cls = item_class(cls, name)
    return cls


def ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


class RunningServer:
    """`async with RunningServer() as env:` a coordinator and server on 127.0.0.1 and a free port."""

    def __init__(self, config: CoordinatorConfig = FAST_GROUPS, *,
                 coordinator_class: type[GroupRuntime] = GroupRuntime, directory: Any = None,
                 **server_options: Any) -> None:
        self.config = config
        self.coordinator_class = coordinator_class
        self.directory = directory
        self.server_config = ServerConfig(listen_host="127.0.0.1", listen_port=0, **server_options)
        self.clients: list[KafkaClient] = []

    async def __aenter__(self) -> RunningServer:
        self.timer = SystemTimer("test")
        self.timer.start()
        self.store = InMemoryGroupStore()
        self.coordinator = self.coordinator_class(self.config, self.timer, self.store)
        self.server = CoordinatorServer(self.server_config, self.coordinator, on_shutdown=self._shutdown_groups,
                                        directory=self.directory)
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


def subscription_metadata(*topics: str) -> bytes:
    return encode_subscription(Subscription(tuple(topics)))


async def join(client: KafkaClient, group_id: str, member_id: str = "", *, version: int = 9,
               session_timeout_ms: int = SESSION_MS, rebalance_timeout_ms: int = 10_000,
               group_instance_id: str | None = None, topics: tuple[str, ...] = ("t",)) -> Any:
    protocol = nested(ApiKey.JOIN_GROUP, version, "protocols")(name="range", metadata=subscription_metadata(*topics))
    body = request(ApiKey.JOIN_GROUP, version, group_id=group_id, session_timeout=ms(session_timeout_ms),
                   rebalance_timeout=ms(rebalance_timeout_ms), member_id=member_id,
                   group_instance_id=group_instance_id, protocol_type="consumer", protocols=(protocol,), reason=None)
    return await client.request(body)


async def join_with_member_id(client: KafkaClient, group_id: str, **options: Any) -> Any:
    """KIP-394: the first JoinGroup (v4+) gets MEMBER_ID_REQUIRED and a member id; join again with it."""
    first = await join(client, group_id, **options)
    if first.error_code != 79:
        return first
    return await join(client, group_id, first.member_id, **options)


async def sync(client: KafkaClient, group_id: str, generation_id: int, member_id: str,
               assignments: dict[str, bytes] | None = None, *, version: int = 5) -> Any:
    entry = nested(ApiKey.SYNC_GROUP, version, "assignments")
    body = request(ApiKey.SYNC_GROUP, version, group_id=group_id, generation_id=generation_id, member_id=member_id,
                   group_instance_id=None, protocol_type="consumer", protocol_name="range",
                   assignments=tuple(entry(member_id=m, assignment=a) for m, a in (assignments or {}).items()))
    return await client.request(body)


def heartbeat(group_id: str, generation_id: int, member_id: str, version: int = 4) -> Any:
    return request(ApiKey.HEARTBEAT, version, group_id=group_id, generation_id=generation_id, member_id=member_id,
                   group_instance_id=None)
