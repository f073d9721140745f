"""Bad input closes the offending connection (or gets Kafka's error response) with a log line, while a
well-behaved member on another connection keeps heartbeating without missing its session deadline."""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from protocol.apis import ApiKey
from tests.support.server import RawPeer, RunningServer
from tests.support.wire import heartbeat, join_with_member_id, sync

SESSION_MS = 1_000
HEARTBEAT_INTERVAL_S = 0.05


class SteadyMember:
    """A member heartbeating in the background; records every round trip."""

    def __init__(self, env: RunningServer) -> None:
        self.env = env
        self.round_trips_s: list[float] = []
        self.errors: list[int] = []
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self.client = await self.env.client()
        joined = await join_with_member_id(self.client, "steady", session_timeout_ms=SESSION_MS)
        self.member_id, self.generation_id = joined.member_id, joined.generation_id
        synced = await sync(self.client, "steady", joined.generation_id, joined.member_id, {joined.member_id: b""})
        assert synced.error_code == 0
        self._task = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            started = time.perf_counter()
            response = await self.client.request(heartbeat("steady", self.generation_id, self.member_id))
            self.round_trips_s.append(time.perf_counter() - started)
            self.errors.append(int(response.error_code))
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)

    async def beats(self, count: int, timeout_s: float = 30) -> None:
        """Until `count` more heartbeats are answered (how many fit in a fixed time depends on the machine)."""
        wanted = len(self.errors) + count
        deadline = time.monotonic() + timeout_s
        while len(self.errors) < wanted:
            assert self._task is not None and not self._task.done(), "the steady member stopped heartbeating"
            assert time.monotonic() < deadline, f"the steady member got {len(self.errors)} of {wanted} answers"
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self._task

    def assert_healthy(self) -> None:
        assert len(self.round_trips_s) >= 3, "the steady member barely got to heartbeat"
        assert set(self.errors) == {0}
        assert max(self.round_trips_s) < SESSION_MS / 1000 / 2  # far inside its session timeout
        assert self.member_id in self.env.coordinator.groups["steady"].members


def _header(api_key: int, version: int, correlation_id: int = 1, client_id: bytes = b"bad") -> bytes:
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


Case = Callable[[RawPeer], Awaitable[None]]


async def _expect_close(peer: RawPeer) -> None:
    assert await peer.closed_by_server()


async def _garbage(peer: RawPeer) -> None:
    await peer.send(b"GET / HTTP/1.1\r\nHost: coordinator\r\n\r\n")
    await _expect_close(peer)


async def _truncated_then_silence(peer: RawPeer) -> None:
    await peer.send(struct.pack(">i", 100) + b"0123456789")
    await _expect_close(peer)  # the idle timeout (short in this test) ends it


async def _two_gib_size(peer: RawPeer) -> None:
    await peer.send(struct.pack(">I", 2**31 - 1) + b"\x00" * 16)
    await _expect_close(peer)


async def _negative_size(peer: RawPeer) -> None:
    await peer.send(struct.pack(">i", -1) + b"\x00" * 16)
    await _expect_close(peer)


async def _unknown_api_key(peer: RawPeer) -> None:
    await peer.send(_frame(_header(4242, 0)))
    await _expect_close(peer)


async def _unsupported_version(peer: RawPeer) -> None:
    await peer.send(_frame(_header(ApiKey.HEARTBEAT, 9) + b"\x00" * 12))
    await _expect_close(peer)


async def _corrupt_body(peer: RawPeer) -> None:
    # Heartbeat v1: a group id that claims 500 bytes in a 6-byte body
    await peer.send(_frame(_header(ApiKey.HEARTBEAT, 1) + struct.pack(">h", 500) + b"abcd"))
    await _expect_close(peer)


async def _null_for_a_non_nullable_array(peer: RawPeer) -> None:
    # LeaveGroup v5: group "g", members null (compact 0), body tags; Kafka refuses it while parsing
    await peer.send(_frame(_header(ApiKey.LEAVE_GROUP, 5) + b"\x00" + b"\x02g" + b"\x00" + b"\x00"))
    await _expect_close(peer)


async def _over_long_varint_in_header_tags(peer: RawPeer) -> None:
    # Heartbeat v4 whose header tag count is a six-byte varint (was: ValueError out of buffer_updated)
    body = b"\x07steady" + struct.pack(">i", 1) + b"\x02m" + b"\x00" + b"\x00"
    await peer.send(_frame(_header(ApiKey.HEARTBEAT, 4) + b"\xff" * 5 + b"\x01" + body))
    await _expect_close(peer)


async def _unknown_tagged_fields(peer: RawPeer) -> None:
    # Heartbeat v4 with unknown tags in the header and the body: Kafka ignores them, and so do we.
    body = b"\x07steady" + struct.pack(">i", -5) + b"\x02m" + b"\x00" + b"\x01\x1f\x03xyz"
    await peer.send(_frame(_header(ApiKey.HEARTBEAT, 4, correlation_id=77) + b"\x01\x05\x01z" + body))
    frame = await peer.read_frame()
    correlation_id, _tags, _throttle, error_code, _body_tags = struct.unpack(">iBihB", frame)
    assert (correlation_id, error_code) == (77, 25)  # answered: UNKNOWN_MEMBER_ID for member "m"
    assert not await peer.closed_by_server(timeout_s=0.2)


async def _unsupported_api_versions_version(peer: RawPeer) -> None:
    await peer.send(_frame(_header(ApiKey.API_VERSIONS, 99, correlation_id=5) + b"\x00\x00\x00"))
    frame = await peer.read_frame()
    correlation_id, error_code, count, key, low, high = struct.unpack(">ihihhh", frame)
    assert (correlation_id, error_code, count, key, low, high) == (5, 35, 1, 18, 0, 4)  # KIP-511, v0 body
    assert not await peer.closed_by_server(timeout_s=0.2)


CASES: dict[str, tuple[Case, str]] = {
    "garbage": (_garbage, "reason=invalid_frame_size"),
    "truncated-then-silence": (_truncated_then_silence, "reason=idle"),
    "2GiB-size": (_two_gib_size, "reason=invalid_frame_size"),
    "negative-size": (_negative_size, "reason=invalid_frame_size"),
    "unknown-api-key": (_unknown_api_key, "reason=UnknownApiKey"),
    "unsupported-version": (_unsupported_version, "reason=UnsupportedVersion"),
    "corrupt-body": (_corrupt_body, "reason=CorruptRequest"),
    "null-non-nullable-array": (_null_for_a_non_nullable_array, "reason=CorruptRequest"),
    "over-long-header-varint": (_over_long_varint_in_header_tags, "reason=CorruptRequest"),
    "unknown-tagged-fields": (_unknown_tagged_fields, ""),
    "api-versions-v99": (_unsupported_api_versions_version, "event=unsupported_api_versions_version"),
}


@pytest.mark.parametrize("name", CASES)
async def test_bad_input_is_contained(name: str, caplog: pytest.LogCaptureFixture) -> None:
    case, log_fragment = CASES[name]
    caplog.set_level(logging.INFO)
    async with RunningServer(idle_timeout_ms=300) as env:
        steady = SteadyMember(env)
        await steady.start()
        peer = await env.raw()
        await case(peer)
        peer.close()
        await steady.beats(3)  # it goes on heartbeating after the bad input
        await steady.stop()
        steady.assert_healthy()
        server_lines = [r.getMessage() for r in caplog.records if r.name == "coordinator.server"]
        assert any(log_fragment in line for line in server_lines), server_lines
        assert not any("handler_failed" in line for line in server_lines)
        # nothing escaped to asyncio ("Fatal error on transport", "Exception in callback") or anywhere else
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_two_gib_frame_is_contained_on_uvloop(caplog) -> None:
    uvloop.run(test_bad_input_is_contained("2GiB-size", caplog))
