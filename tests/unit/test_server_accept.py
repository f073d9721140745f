"""The listener's own accept path (coordinator/server/accept.py): a connect storm queued in the kernel is accepted
in full batches of a bounded size, one per loop turn, on asyncio and uvloop, and every connection is served."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import socket
import struct
import warnings

from typing import Any

import uvloop

from coordinator.server.accept import ACCEPTS_PER_TURN
from protocol import codec
from protocol.apis import ApiKey
from tests.support.server import RunningServer
from tests.support.wire import request

STORM = 600  # more than four turns' worth, under somaxconn (4,096 here and by default)


def _connect_all(port: int, count: int) -> list[socket.socket]:
    """`count` connections started in one go (loopback completes each handshake into the listen queue)."""
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        assert sock.connect_ex(("127.0.0.1", port)) in (0, errno.EINPROGRESS)
        socks.append(sock)
    return socks


def _accept_queue(listening: Any) -> int:
    """Connections waiting in a listening socket's accept queue (Linux: TCP_INFO's tcpi_unacked on a listener)."""
    info = listening.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int(struct.unpack_from("I", info, 24)[0])


async def _accepted_per_turn(env: RunningServer, count: int) -> list[int]:
    """Connections taken from the kernel's accept queue in each loop turn that took any, until the server has made
    `count` (bounded); called right after the connections were queued."""
    loop = asyncio.get_running_loop()
    listening = env.server._server.sockets[0]  # type: ignore[union-attr]
    queued = [_accept_queue(listening)]
    done = loop.create_future()

    def tick() -> None:
        queued.append(_accept_queue(listening))
        if env.server.connection_count >= count:
            done.set_result(None)
        else:
            loop.call_soon(tick)

    loop.call_soon(tick)
    await asyncio.wait_for(done, 30)
    return [before - after for before, after in zip(queued, queued[1:]) if before != after]


async def test_a_connect_storm_is_accepted_in_bounded_batches_and_every_connection_served() -> None:
    async with RunningServer() as env:
        socks = _connect_all(env.port, STORM)  # in this one callback: the server's next turn finds all queued
        try:
            accepted = await _accepted_per_turn(env, STORM)
            assert env.server.connection_count == STORM
            assert sum(accepted) == STORM and max(accepted) <= ACCEPTS_PER_TURN, accepted
            # a full batch a turn, not one connection a turn (what uvloop's own accept path did here)
            assert len(accepted) <= -(-STORM // ACCEPTS_PER_TURN) + 1, accepted
            # each accepted connection is a working one: an ApiVersions answered on the last and the first
            loop = asyncio.get_running_loop()
            for sock in (socks[-1], socks[0]):
                await loop.sock_sendall(sock, codec.encode_request(7, "t", request(ApiKey.API_VERSIONS, 0)))
                answer = await asyncio.wait_for(loop.sock_recv(sock, 65_536), 10)
                assert answer[4:8] == (7).to_bytes(4, "big")
        finally:
            for sock in socks:
                sock.close()


async def test_closing_the_listener_refuses_new_connections_and_keeps_the_made_ones() -> None:
    async with RunningServer() as env:
        client = await env.client()
        port = env.port
        assert env.server._server is not None
        env.server._server.close()
        await env.server._server.wait_closed()
        loop = asyncio.get_running_loop()
        refused = socket.socket()
        refused.setblocking(False)
        try:
            try:
                await asyncio.wait_for(loop.sock_connect(refused, ("127.0.0.1", port)), 5)
                raise AssertionError("connected to a closed listener")
            except ConnectionRefusedError:
                pass
        finally:
            refused.close()
        assert (await client.request(request(ApiKey.API_VERSIONS, 0))).error_code == 0


def _ipv6_loopback() -> bool:
    """Whether this machine has ::1 (IPv6 enabled on the loopback interface)."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


async def _api_versions_answered(family: socket.AddressFamily, host: str, port: int) -> bool:
    loop = asyncio.get_running_loop()
    with socket.socket(family) as sock:
        sock.setblocking(False)
        await asyncio.wait_for(loop.sock_connect(sock, (host, port)), 5)
        await loop.sock_sendall(sock, codec.encode_request(9, "t", request(ApiKey.API_VERSIONS, 0)))
        answer = await asyncio.wait_for(loop.sock_recv(sock, 65_536), 10)
        return answer[4:8] == (9).to_bytes(4, "big")


async def _serving(listen_host: str) -> RunningServer:
    env = RunningServer()
    env.server_config = dataclasses.replace(env.server_config, listen_host=listen_host, advertised_host="localhost")
    return await env.__aenter__()


async def test_a_listener_on_a_host_name_accepts_on_every_address_it_resolves_to() -> None:
    """As loop.create_server: `localhost` is 127.0.0.1 and ::1 where the resolver says both (127.0.0.1 alone where
    /etc/hosts has no ::1 line: then the next test is the one that sees two families)."""
    resolved = {(family, address[0]) for family, _, _, _, address in
                socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)}
    env = await _serving("localhost")
    try:
        assert env.server._server is not None
        bound = {(sock.family, sock.getsockname()[0]) for sock in env.server._server.sockets}
        assert bound == resolved
        assert {sock.getsockname()[1] for sock in env.server._server.sockets} == {env.port}  # one port for all
        for family, host in sorted(resolved):
            assert await _api_versions_answered(family, host, env.port), host
    finally:
        await env.__aexit__(None, None, None)


async def test_a_listener_on_every_interface_accepts_on_ipv4_and_ipv6_loopback() -> None:
    env = await _serving("")
    try:
        assert await _api_versions_answered(socket.AF_INET, "127.0.0.1", env.port)
        if _ipv6_loopback():
            assert await _api_versions_answered(socket.AF_INET6, "::1", env.port), "::1 not served on its port"
        else:  # only the IPv6 check is skipped, and said so in the run's warnings
            warnings.warn("no IPv6 loopback on this machine: the listener's ::1 check is skipped", stacklevel=1)
    finally:
        await env.__aexit__(None, None, None)


def test_a_connect_storm_on_uvloop() -> None:
    uvloop.run(test_a_connect_storm_is_accepted_in_bounded_batches_and_every_connection_served())


def test_closing_the_listener_on_uvloop() -> None:
    uvloop.run(test_closing_the_listener_refuses_new_connections_and_keeps_the_made_ones())


def test_every_address_on_uvloop() -> None:
    uvloop.run(test_a_listener_on_every_interface_accepts_on_ipv4_and_ipv6_loopback())
