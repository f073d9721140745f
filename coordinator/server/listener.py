"""The asyncio listener: accepts connections, enforces the connection limits, and shuts down gracefully.

Graceful shutdown, in order: stop accepting; stop reading new requests; give requests in flight up to
`shutdown_grace_ms` to be answered; run the shutdown hook (the coordinator stops its timer reaper there and
answers what is still parked); close every connection after flushing what was written; cancel leftovers.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from coordinator.security.identity import security_protocol
from coordinator.server.accept import Acceptor
from coordinator.server.config import ServerConfig
from coordinator.server.connection import Connection
from coordinator.server.context import Directory, GroupService, Node
from coordinator.timer.clock import Clock, MonotonicClock

if TYPE_CHECKING:
    from coordinator.relay.relay import Relay
    from coordinator.security.authorizer import Authorizer

log = logging.getLogger("coordinator.server")

ShutdownHook = Callable[[], Awaitable[None]]
_HOOK_SETTLE_S = 0.05  # lets responses completed by the shutdown hook be written before we close
_SWEEP_BATCH = 1_000  # connections checked for idleness per loop iteration (~1.1 µs each at 100k members)
# connections paused, then closed, per loop turn at shutdown: ~1.3 / 4.7 µs to pause one, ~2 / 7 µs to close one
# (uvloop / asyncio; its connection_lost follows in a later callback), so a batch is ≤ ~6 ms; 8,000 connections all
# at once were a busy stretch of 45 ms on asyncio, 18 ms on uvloop (13.6 / 9.3 ms in batches)
_CLOSE_BATCH = 500
_SAME_PORT_ATTEMPTS = 5  # port 0 on several addresses: binds tried until one port is free on all of them


class CoordinatorServer:
    def __init__(
        self,
        config: ServerConfig,
        coordinator: GroupService,
        *,
        clock: Clock | None = None,
        on_shutdown: ShutdownHook | None = None,
        relay: Relay | None = None,
        directory: Directory | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.config = config
        self.authorizer = authorizer  # the cluster's ACLs on the group APIs (None: nothing enforced)
        self.relay = relay
        self.directory = directory  # several instances: who coordinates which group (None: we do, all of them)
        self.coordinator = coordinator
        self.clock = clock or MonotonicClock()
        self.node = Node(config.node_id, config.advertised_host or config.listen_host,
                         config.advertised_port or config.listen_port, config.cluster_id)
        self.closing = False
        self._on_shutdown = on_shutdown
        self._server: Acceptor | None = None
        self._connections: set[Connection] = set()
        self._busy: set[Connection] = set()
        self.parks = 0  # requests parked since the start (a connection counted busy): what tests observe
        self._idle_sweeper: asyncio.Task | None = None
        self._all_idle = asyncio.Event()
        self._all_idle.set()

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        listeners = _listening_sockets(self.config.listen_host, self.config.listen_port)
        # not serving yet: with the relay, its broker listeners open first (below)
        self._server = Acceptor(listeners, lambda: Connection(self), ssl_context=self.config.ssl_context)
        self._port = listeners[0].getsockname()[1]
        if not self.config.listen_port or not self.config.advertised_port:
            self.node = Node(self.node.node_id, self.node.host, self.config.advertised_port or self.port,
                             self.node.cluster_id)
        if self.relay is not None:  # its broker listeners are open before the first client arrives
            self.relay.attach(self.config.listen_host, self.config.listen_port and self.port, self.node,
                              self._open_broker_listener, self._close_broker_connections)
            try:
                await self.relay.start()
            except BaseException:
                self._server.close()
                await self.relay.close()
                raise
        for listener in listeners:
            listener.listen(self.config.listen_backlog)  # the kernel's queue absorbs a connect storm
        self._server.start_serving()
        self._idle_sweeper = loop.create_task(self._sweep_idle_connections())
        log.info("event=listening security_protocol=%s host=%s port=%d advertised=%s:%d node_id=%d "
                 "listen_backlog=%d somaxconn=%s", security_protocol(self.config.ssl_context is not None,
                                                                     self.config.sasl_passthrough),
                 self.config.listen_host, self.port, self.node.host, self.node.port, self.node.node_id,
                 self.config.listen_backlog, _somaxconn())

    async def _open_broker_listener(self, host: str, port: int, node_id: int) -> Acceptor:
        """A listener standing for upstream broker `node_id`: its connections relay to that broker."""
        listeners = _listening_sockets(host, port)
        acceptor = Acceptor(listeners, lambda: Connection(self, upstream_node=node_id),
                            ssl_context=self.config.ssl_context)
        try:
            for listener in listeners:
                listener.listen(self.config.listen_backlog)
        except BaseException:
            acceptor.close()
            raise
        acceptor.start_serving()
        return acceptor

    def _close_broker_connections(self, node_id: int) -> None:
        for connection in list(self._connections):
            if connection.upstream_node == node_id:
                connection.abort("broker_left_cluster", f"node_id={node_id}")

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return self._port

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        if self._server is not None:
            self._server.close()
        if self.relay is not None:
            self.relay.stop_accepting()
        await _in_batches(list(self._connections), Connection.stop_reading)
        await self._wait_in_flight(self.config.shutdown_grace_ms)
        if self._on_shutdown is not None:
            await self._on_shutdown()
            await asyncio.sleep(_HOOK_SETTLE_S)
        await _in_batches(list(self._connections | self._busy), _close_at_shutdown)
        if self.relay is not None:
            await self.relay.close()
        if self._idle_sweeper is not None:
            self._idle_sweeper.cancel()
        if self._server is not None:
            await self._server.wait_closed()
        log.info("event=server_stopped node_id=%d", self.node.node_id)

    async def _wait_in_flight(self, grace_ms: int) -> None:
        try:
            await asyncio.wait_for(self._all_idle.wait(), grace_ms / 1000)
        except asyncio.TimeoutError:
            log.warning("event=shutdown_grace_expired in_flight=%d", len(self._busy))

    # ------------------------------------------------------------------------------------------ bookkeeping

    def admit(self, connection: Connection) -> bool:
        if self.closing or len(self._connections) >= self.config.max_connections:
            return False
        self._connections.add(connection)
        return True

    def forget(self, connection: Connection) -> None:
        self._connections.discard(connection)

    def parked(self, connection: Connection) -> None:
        self.parks += 1
        busy = self._busy
        if not busy:  # the first: no longer all idle (cleared once, not per parked request: a rebalance parks
            self._all_idle.clear()  # every member's JoinGroup and most SyncGroups)
        busy.add(connection)

    def unparked(self, connection: Connection) -> None:
        self._busy.discard(connection)
        if not self._busy:
            self._all_idle.set()

    async def _sweep_idle_connections(self) -> None:
        """Close connections silent for idle_timeout_ms (Kafka's connections.max.idle.ms), unless a request of
        theirs is still in flight. Silence is seen at the sweep interval's resolution (a tenth of the timeout)."""
        interval_s = max(self.config.idle_timeout_ms / 10, 10) / 1000
        while True:
            await asyncio.sleep(interval_s)
            now_ms = self.clock.now_ms()
            for index, connection in enumerate(list(self._connections)):
                if index % _SWEEP_BATCH == _SWEEP_BATCH - 1:
                    await asyncio.sleep(0)  # 100k connections: a few ms per batch, not one long stall
                if connection.activity != connection.activity_seen or connection.is_busy:
                    connection.activity_seen = connection.activity
                    connection.quiet_since_ms = now_ms
                    continue
                idle_ms = now_ms - connection.quiet_since_ms
                if idle_ms >= self.config.idle_timeout_ms:
                    connection.abort("idle", f"idle_ms={idle_ms}")


async def _in_batches(connections: list[Connection], step: Callable[[Connection], None]) -> None:
    """`step` on every connection, `_CLOSE_BATCH` a loop turn: stopping with thousands of connections is not one
    long callback (the heartbeats of the connections still open, timers and the state writer's callbacks run in
    between). A connection that closed meanwhile takes the step as a no-op."""
    for index, connection in enumerate(connections):
        if index and not index % _CLOSE_BATCH:
            await asyncio.sleep(0)
        step(connection)


def _close_at_shutdown(connection: Connection) -> None:
    connection.cancel_in_flight()
    connection.close()  # after what was written: the transport flushes it first


def _listening_sockets(host: str, port: int) -> list[socket.socket]:
    """Bound TCP sockets for an Acceptor, one per address `host` resolves to, as loop.create_server binds them
    (`localhost`: 127.0.0.1 and ::1; no host: every interface); their backlog is ours to set. With port 0 every
    address gets the port the first was given, so the listener has one port to advertise (tried again where
    another address has that port taken)."""
    addresses = list(dict.fromkeys(
        (family, kind, proto, address) for family, kind, proto, _, address in
        socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)))
    attempts = 1 if port else _SAME_PORT_ATTEMPTS
    while True:
        attempts -= 1
        try:
            return _bind_all(host, addresses, port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or not attempts:
                raise


def _bind_all(host: str, addresses: Sequence[tuple[int, int, int, Any]], port: int) -> list[socket.socket]:
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, address in addresses:
            if bound and not port:
                address = (address[0], bound[0].getsockname()[1], *address[2:])
            sock = _bound_socket(family, kind, proto, address)
            if sock is not None:
                bound.append(sock)
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    if not bound:
        raise OSError(errno.EADDRNOTAVAIL, f"no address of {host!r} can be bound on this machine")
    return bound


def _bound_socket(family: int, kind: int, proto: int, address: Any) -> socket.socket | None:
    """A non-blocking socket bound to `address`; None when the machine lacks that address or its family (IPv6
    disabled), which asyncio's create_server skips too."""
    try:
        sock = socket.socket(family, kind, proto)
    except OSError:
        return None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL:
                raise
            sock.close()
            return None
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _somaxconn() -> str:
    """The kernel's cap on any listen backlog (Linux), for the startup log line."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


async def serve(
    config: ServerConfig,
    coordinator: GroupService,
    *,
    clock: Clock | None = None,
    stop: asyncio.Event | None = None,
    on_started: Callable[[CoordinatorServer], None] | None = None,
    on_shutdown: ShutdownHook | None = None,
) -> None:
    """Serve the Kafka protocol until `stop` is set (or this task is cancelled), then shut down gracefully."""
    server = CoordinatorServer(config, coordinator, clock=clock, on_shutdown=on_shutdown)
    await server.start()
    if on_started is not None:
        on_started(server)
    try:
        await (stop.wait() if stop is not None else asyncio.Future())
    finally:
        await asyncio.shield(server.close())
