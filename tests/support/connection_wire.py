"""A server connection driven by hand in unit tests: the transport it writes to, one read handed to it, and a
runtime with one Stable classic group to talk to."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from coordinator.config import CoordinatorConfig
from coordinator.group.records import GroupRecord, MemberRecord
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.server.connection import Connection
from coordinator.server.listener import CoordinatorServer
from coordinator.timer import ManualClock, SystemTimer
from protocol import codec
from protocol.apis import ApiKey
from tests.support.group_harness import subscription
from tests.support.wire import ms, nested, request


class RecordingTransport:
    """The transport: what the connection writes (each write apart), whether it reads, whether it was aborted."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.aborted = False
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name in ("peername", "sockname") else default

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None: ...

    def abort(self) -> None:
        self.aborted = True


def connected(server: CoordinatorServer) -> tuple[Connection, RecordingTransport]:
    """A connection of `server`'s over a transport that records what is written to it."""
    connection = Connection(server)
    wire = RecordingTransport()
    connection.connection_made(wire)  # type: ignore[arg-type]
    return connection, wire


def join_frame(correlation_id: int, member_id: str, session_ms: int = 30_000) -> bytes:
    """A JoinGroup v9 to group "g" as a consumer sends it (the range assignor, subscribed to topic "t")."""
    protocol = nested(ApiKey.JOIN_GROUP, 9, "protocols")(name="range", metadata=subscription("t"))
    body = request(ApiKey.JOIN_GROUP, 9, group_id="g", session_timeout=ms(session_ms), rebalance_timeout=ms(60_000),
                   member_id=member_id, group_instance_id=None, protocol_type="consumer", protocols=(protocol,),
                   reason=None)
    return codec.encode_request(correlation_id, "client", body)


async def within_loop_turns(condition: Callable[[], object], limit: int = 50) -> None:
    """`condition` true within `limit` loop turns, or the test fails (no clock involved: turns, not seconds)."""
    for _ in range(limit):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("not within the loop turns allowed")


def receive(connection: Connection, data: bytes) -> None:
    """`data` as one read of the transport (the lent buffer, then buffer_updated)."""
    buffer = connection.get_buffer(-1)
    buffer[: len(data)] = data
    del buffer
    connection.buffer_updated(len(data))


@contextlib.asynccontextmanager
async def stable_group_runtime(members: Sequence[str], session_ms: int) -> AsyncIterator[GroupRuntime]:
    """A runtime on a manual clock whose group "g" is loaded Stable at generation 1 (range, topic "t"), the first
    member leading."""
    clock = ManualClock(1_000_000)
    timer = SystemTimer("test", clock=clock)
    timer.start()
    store = InMemoryGroupStore()
    records = [MemberRecord(m, None, "c", "/127.0.0.1", 60_000, session_ms, subscription("t"), b"") for m in members]
    store.groups["g"] = GroupRecord("consumer", 1, "range", members[0], 0, records)
    runtime = GroupRuntime(CoordinatorConfig(), timer, store, clock)
    await runtime.load()
    try:
        yield runtime
    finally:
        await runtime.shutdown()
        await timer.close()
