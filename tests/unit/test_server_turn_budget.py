"""Requests handled per loop turn are bounded (coordinator/server/turns.py): a flood of frames that arrived together,
on many connections or pipelined on one, is handled over several turns, and a callback scheduled during the flood (a
state write's acknowledgement, a timer) runs before the flood's end. Every request is still answered, in order.
The floods are Heartbeat v3 (the general path: a request's full units); v4 on its fast path costs a unit."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from typing import Any

import pytest
import uvloop

from coordinator.embedded.certificates import CertificateSet, make_test_certificates
from coordinator.security.listeners import Listener, server_ssl_context
from coordinator.server.turns import (HEARTBEAT_UNITS, REQUEST_UNITS, STEADY_CONSUMER_GROUP_HEARTBEAT_UNITS,
                                      TurnBudget, turn_budget)
from protocol import codec
from protocol.apis import ApiKey
from protocol.error_codes import Errors
from tests.support.server import RunningServer, connected_sockets
from tests.support.service_front import ServiceFront
from tests.support.wire import heartbeat, ms, request

_V3_ANSWER_BYTES = 14  # size prefix, correlation id, throttle time, error code
_V4_ANSWER_BYTES = 16  # the same with the flexible versions' tag bytes


class _CountingRuntime(ServiceFront):
    """Counts heartbeats; the first one schedules a callback that notes how many had been handled when it ran.
    A ticker rescheduled every turn splits the heartbeats by the turn that handled them."""

    handled = 0
    seen_by_callback: list[int]
    per_turn: list[int]

    def start_counting(self) -> None:
        self.handled, self.seen_by_callback, self.per_turn = 0, [], [0]
        loop = asyncio.get_running_loop()

        def tick() -> None:
            if self.per_turn[-1]:
                self.per_turn.append(0)
            loop.call_soon(tick)

        self._ticker = loop.call_soon(tick)

    def stop_counting(self) -> None:
        self._ticker.cancel()

    def handle_heartbeat(self, group_id: str, generation_id: int, member_id: str,
                         group_instance_id: str | None = None) -> Errors:
        if self.handled == 0:
            asyncio.get_running_loop().call_soon(lambda: self.seen_by_callback.append(self.handled))
        self.handled += 1
        self.per_turn[-1] += 1
        return self.runtime.handle_heartbeat(group_id, generation_id, member_id, group_instance_id)


def _frames(count: int, first_correlation_id: int = 0, *, version: int = 3) -> bytes:
    body = heartbeat("g", 1, "unknown-member", version=version)
    return b"".join(codec.encode_request(first_correlation_id + i, "t", body) for i in range(count))


async def _read_responses(sock: socket.socket, count: int, answer_bytes: int = _V3_ANSWER_BYTES) -> list[int]:
    """The correlation ids of `count` Heartbeat answers, in the order they came."""
    loop = asyncio.get_running_loop()
    data = b""
    while len(data) < count * answer_bytes:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 65_536), 10)
        assert chunk, "the server closed the connection"
        data += chunk
    assert len(data) == count * answer_bytes
    return [struct.unpack_from(">i", data, i * answer_bytes + 4)[0] for i in range(count)]


async def _full_budget() -> None:
    """The next turns start with the whole budget: the budget is refilled only once half of it is spent, so what
    the connections' setup spent may still be missing from it."""
    budget = turn_budget()
    budget.spend(budget.left)
    await asyncio.sleep(0)  # the refill, scheduled first, runs before this task goes on
    assert budget.left == budget.per_turn


def _requests_per_turn() -> int:
    return turn_budget().per_turn // REQUEST_UNITS


async def test_a_flood_over_many_connections_is_handled_over_several_turns() -> None:
    connections = 300
    async with RunningServer(front=_CountingRuntime) as env:
        runtime: Any = env.service
        per_turn = _requests_per_turn()
        assert connections > 2 * per_turn
        socks = await connected_sockets(env, connections)
        try:
            runtime.start_counting()
            frame = _frames(1)
            for sock in socks:  # in one callback: every connection is readable in the server's next turn
                sock.send(frame)
            answers = await asyncio.gather(*(_read_responses(sock, 1) for sock in socks))
            runtime.stop_counting()
        finally:
            for sock in socks:
                sock.close()
        assert answers == [[0]] * connections
        assert runtime.handled == connections
        # the callback scheduled by the first request ran after at most this turn's and the next turn's budget
        assert runtime.seen_by_callback[0] <= 2 * per_turn, runtime.seen_by_callback
        assert max(runtime.per_turn) <= per_turn, runtime.per_turn
        assert turn_budget().waiting == 0


async def test_pipelined_frames_of_one_connection_are_handled_over_several_turns_in_order() -> None:
    frames = 150  # 7 KB: one read
    async with RunningServer(front=_CountingRuntime) as env:
        runtime: Any = env.service
        per_turn = _requests_per_turn()
        assert frames > 2 * per_turn
        (sock,) = await connected_sockets(env, 1)
        try:
            runtime.start_counting()
            sock.send(_frames(frames, first_correlation_id=1_000))
            answered = await _read_responses(sock, frames)
            runtime.stop_counting()
        finally:
            sock.close()
        assert answered == list(range(1_000, 1_000 + frames))
        assert runtime.seen_by_callback[0] <= 2 * per_turn, runtime.seen_by_callback
        assert max(runtime.per_turn) <= per_turn, runtime.per_turn


async def test_frames_deferred_when_the_peer_half_closes_are_answered_before_the_close() -> None:
    frames = 150
    async with RunningServer(front=_CountingRuntime) as env:
        runtime: Any = env.service
        (sock,) = await connected_sockets(env, 1)
        try:
            runtime.start_counting()
            sock.send(_frames(frames))
            sock.shutdown(socket.SHUT_WR)
            answered = await _read_responses(sock, frames)
            assert await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 1), 10) == b""  # then closed
            runtime.stop_counting()
        finally:
            sock.close()
        assert answered == list(range(frames))
        assert runtime.per_turn[0] <= _requests_per_turn()  # the rest may go in the last turn, the budget aside


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> CertificateSet:
    return make_test_certificates(tmp_path_factory.mktemp("turn-budget-certificates"))


class _TlsPeer:
    """A TLS client over a raw socket (memory BIOs): it can send close_notify, or half-close TCP, and still read."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock = sock
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname="localhost")

    async def _send_pending(self) -> None:
        data = self._outgoing.read()
        if data:
            await self._loop.sock_sendall(self._sock, data)

    async def _receive(self) -> bool:
        chunk = await asyncio.wait_for(self._loop.sock_recv(self._sock, 65_536), 10)
        if chunk:
            self._incoming.write(chunk)
        else:
            self._incoming.write_eof()
        return bool(chunk)

    async def handshake(self) -> None:
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._send_pending()
                assert await self._receive(), "the server closed the connection during the handshake"
        await self._send_pending()

    async def send(self, data: bytes) -> None:
        self._tls.write(data)
        await self._send_pending()

    async def close_notify(self) -> None:
        try:
            self._tls.unwrap()
        except ssl.SSLWantReadError:
            pass  # the server's close_notify comes after its answers
        await self._send_pending()

    async def read_until_closed(self) -> bytes:
        data = b""
        while True:
            try:
                data += self._tls.read(65_536)
            except ssl.SSLWantReadError:
                if not await self._receive():
                    return data
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return data


async def test_frames_deferred_when_a_tls_peer_half_closes_are_handled_and_answered(
        certificates: CertificateSet) -> None:
    """On TLS the loop closes the transport after eof_received (close_notify) whatever it returns: the deferred
    frames are handled within that call (the connection's last turn), and answered before the close."""
    frames = 600  # ten turns' budget: several turns between their arrival and the close
    server_tls = server_ssl_context(Listener("SSL", "127.0.0.1", 0), {
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(certificates.broker_keystore)})
    client_tls = ssl.create_default_context(cafile=str(certificates.ca))
    async with RunningServer(front=_CountingRuntime, ssl_context=server_tls) as env:
        runtime: Any = env.service
        assert frames > 2 * _requests_per_turn()
        sock = socket.socket()
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", env.port))
            peer = _TlsPeer(sock, client_tls)
            await peer.handshake()
            runtime.start_counting()
            await peer.send(_frames(frames))
            await peer.close_notify()
            data = await peer.read_until_closed()
            runtime.stop_counting()
        finally:
            sock.close()
        assert runtime.handled == frames, f"{runtime.handled} of {frames} requests handled before the close"
        answered = [struct.unpack_from(">i", data, i * _V3_ANSWER_BYTES + 4)[0]
                    for i in range(len(data) // _V3_ANSWER_BYTES)]
        assert answered == list(range(frames)) and len(data) == frames * _V3_ANSWER_BYTES


async def test_heartbeats_on_their_fast_path_cost_a_unit_each() -> None:
    """Heartbeats of as many connections as a turn's units are handled in one turn; more wait for the next."""
    per_turn = turn_budget().per_turn // HEARTBEAT_UNITS
    connections = per_turn + per_turn // 2
    async with RunningServer(front=_CountingRuntime) as env:
        runtime: Any = env.service
        socks = await connected_sockets(env, connections)
        try:
            await _full_budget()
            runtime.start_counting()
            frame = _frames(1, version=4)
            for sock in socks:
                sock.send(frame)
            answers = await asyncio.gather(*(_read_responses(sock, 1, _V4_ANSWER_BYTES) for sock in socks))
            runtime.stop_counting()
        finally:
            for sock in socks:
                sock.close()
        assert answers == [[0]] * connections
        assert max(runtime.per_turn) == per_turn, runtime.per_turn  # a full turn's worth at once, and no more


class _CountingConsumerRuntime(_CountingRuntime):
    """Counts ConsumerGroupHeartbeats: those answered from their frame (the steady path) and those the general
    path starts, once counting has started (the member's join is not counted)."""

    counting = False

    def start_counting(self) -> None:
        super().start_counting()
        self.counting = True

    def _count(self) -> None:
        if self.counting:
            self.handled += 1
            self.per_turn[-1] += 1

    def steady_consumer_group_heartbeat(self, req: Any) -> Any:
        answer = self.runtime.steady_consumer_group_heartbeat(req)
        if answer is not None:
            self._count()
        return answer

    def start_consumer_group_heartbeat(self, req: Any) -> Any:
        self._count()
        return self.runtime.start_consumer_group_heartbeat(req)


def _consumer_heartbeat(member_id: str, epoch: int, **fields: Any) -> Any:
    plain = dict(rebalance_timeout=ms(-1), subscribed_topic_names=None, topic_partitions=None)
    return request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, group_id="cg", member_id=member_id, member_epoch=epoch,
                   instance_id=None, rack_id=None, subscribed_topic_regex=None, server_assignor=None,
                   **{**plain, **fields})


async def _error_code(sock: socket.socket) -> int:
    """The error code of the ConsumerGroupHeartbeat answer `sock` receives."""
    loop = asyncio.get_running_loop()
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 65_536), 10)
        assert chunk, "the server closed the connection"
        data += chunk
    # size, correlation id, header tags, throttle time, then the error code
    return struct.unpack_from(">h", data, 13)[0]


@pytest.mark.parametrize("steady", [True, False], ids=["answered-from-the-frame", "general-path"])
async def test_a_consumer_group_heartbeat_costs_the_units_of_the_path_that_served_it(steady: bool) -> None:
    """Steady ConsumerGroupHeartbeats of as many connections as a turn's budget holds at their units are handled
    in one turn; one the general path serves (here: of a member the group does not know) costs a request's."""
    units = STEADY_CONSUMER_GROUP_HEARTBEAT_UNITS if steady else REQUEST_UNITS
    per_turn = turn_budget().per_turn // units
    connections = per_turn + per_turn // 2
    async with RunningServer(front=_CountingConsumerRuntime) as env:
        runtime: Any = env.service
        client = await env.client()
        joined = await client.request(_consumer_heartbeat("m-1", 0, rebalance_timeout=ms(30_000),
                                                          subscribed_topic_names=("t",), topic_partitions=()))
        assert joined.error_code == 0
        member_id = "m-1" if steady else "m-unknown"
        frame = codec.encode_request(0, "t", _consumer_heartbeat(member_id, joined.member_epoch))
        socks = await connected_sockets(env, connections + 1)  # the client's connection is one of them
        try:
            # the frames' client id differs from the join's: that change is written (and the heartbeats of its turn
            # wait for the write) before the counted ones come
            socks[connections].send(frame)
            await _error_code(socks[connections])
            await _full_budget()
            runtime.start_counting()
            for sock in socks[:connections]:
                sock.send(frame)
            answers = await asyncio.gather(*(_error_code(sock) for sock in socks[:connections]))
            runtime.stop_counting()
        finally:
            for sock in socks:
                sock.close()
        assert answers == [0 if steady else Errors.UNKNOWN_MEMBER_ID] * connections
        assert runtime.handled == connections
        assert max(runtime.per_turn) == per_turn, runtime.per_turn  # a full turn's worth at once, and no more


def test_a_flood_over_many_connections_on_uvloop() -> None:
    uvloop.run(test_a_flood_over_many_connections_is_handled_over_several_turns())


def test_pipelined_frames_on_uvloop() -> None:
    uvloop.run(test_pipelined_frames_of_one_connection_are_handled_over_several_turns_in_order())


def test_frames_deferred_when_a_tls_peer_half_closes_on_uvloop(certificates: CertificateSet) -> None:
    uvloop.run(test_frames_deferred_when_a_tls_peer_half_closes_are_handled_and_answered(certificates))


async def test_the_budget_is_refilled_once_half_of_it_is_spent_not_every_turn() -> None:
    """A request alone in its turn (a heartbeat of one of many connections) schedules no loop callback: the refill
    comes in the turn after half the budget is spent, so every turn starts with more than half of it."""
    budget = TurnBudget(asyncio.get_running_loop(), per_turn=8)
    for _ in range(3):
        budget.spend(1)
        await asyncio.sleep(0)  # a later turn
    assert budget.left == 5  # three turns, no refill
    budget.spend(1)
    assert budget.left == 4
    await asyncio.sleep(0)
    assert budget.left == 8
