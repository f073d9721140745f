"""One listener per upstream broker, at a port derived from its node id (port = base_port + node id), so every
coordinator instance and every restart agrees on which port is which broker without sharing state (clients
reconnect straight to a broker's port after a restart, not through the bootstrap address).

Listeners follow the cluster: the broker list of every Metadata answer opens listeners for brokers not seen
before and closes those of brokers no longer listed (their clients' connections close with them).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger("coordinator.relay")

MAX_PORT = 65_535


class Listening(Protocol):
    """What a broker listener is to us: asyncio's Server, or the server's own acceptor (server/accept.py)."""

    @property
    def sockets(self) -> Sequence[socket.socket]: ...
    def close(self) -> None: ...


# (host, port, upstream node id) -> a listener whose connections relay to that broker (the server makes it)
OpenListener = Callable[[str, int, int], Awaitable[Listening]]

@dataclass(frozen=True, slots=True)
class UpstreamBroker:
    node_id: int
    host: str
    port: int
    rack: str | None = None


class PortMapping:
    """node id -> our listener port; None base (ephemeral bootstrap port): each listener takes any free port."""

    def __init__(self, base_port: int | None) -> None:
        self.base_port = base_port

    def port_for(self, node_id: int) -> int:
        if self.base_port is None:
            return 0
        port = self.base_port + node_id
        if not 0 < port <= MAX_PORT:
            raise ValueError(f"node id {node_id} maps to port {port}, outside 1..{MAX_PORT}: "
                             f"choose a relay base port so that base + node id fits")
        return port


class RelayPortsTaken(RuntimeError):
    """A broker listener's port is held by another process when the relay starts."""


ListenerFactory = Callable[[int, int], "asyncio.Future[Listening]"]


class BrokerListeners:
    """The live per-broker listeners: `reconcile(brokers)` after every broker list we see."""

    def __init__(self, listen_host: str, mapping: PortMapping,
                 open_listener: OpenListener,
                 close_connections: Callable[[int], None]) -> None:
        self._listen_host = listen_host
        self._mapping = mapping
        self._open_listener = open_listener
        self._close_connections = close_connections
        self._servers: dict[int, Listening] = {}
        self._ports: dict[int, int] = {}
        self.taken: dict[int, int] = {}  # node id -> its port, taken by another process at the latest attempt
        self._lock = asyncio.Lock()

    def refuse_clash(self, base_given: bool) -> None:
        """At start: a broker's listener port taken (another instance on this host, usually: consecutive listen
        ports meet each other's broker ports) refuses the start, with the flag that fixes it, rather than serving
        without a way to that broker."""
        if not self.taken:
            return
        node_id, port = min(self.taken.items())
        how = "--relay-base-port" if base_given else "the default base, the listen port + 1,"
        raise RelayPortsTaken(
            f"the relay's listener for broker {node_id} needs port {port} ({how} + node id {node_id}), and another "
            f"process holds it (another coordinator on this host?). Give each instance on one host its own "
            f"--relay-base-port, far enough apart for the cluster's node ids (e.g. 19100, 19200, ...; env "
            f"COORDINATOR_RELAY_BASE_PORT)")

    @property
    def ports(self) -> dict[int, int]:
        """node id -> the port its listener is bound to."""
        return dict(self._ports)

    def port_of(self, node_id: int) -> int | None:
        return self._ports.get(node_id)

    async def reconcile(self, brokers: Mapping[int, UpstreamBroker]) -> None:
        async with self._lock:
            for node_id in sorted(set(brokers) - set(self._servers)):
                await self._open(brokers[node_id])
            for node_id in sorted(set(self._servers) - set(brokers)):
                self._close(node_id, "left_cluster")

    async def _open(self, broker: UpstreamBroker) -> None:
        port = 0
        try:
            port = self._mapping.port_for(broker.node_id)
            server = await self._open_listener(self._listen_host, port, broker.node_id)
        except (OSError, ValueError) as exc:
            if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
                self.taken[broker.node_id] = port
            log.error("event=relay_listener_failed node_id=%d port=%d upstream=%s:%d error=%s%s",
                      broker.node_id, port, broker.host, broker.port, exc,
                      " fix=--relay-base-port" if broker.node_id in self.taken else "")
            return
        self.taken.pop(broker.node_id, None)
        self._servers[broker.node_id] = server
        self._ports[broker.node_id] = server.sockets[0].getsockname()[1]
        log.info("event=relay_listener_opened node_id=%d port=%d upstream=%s:%d",
                 broker.node_id, self._ports[broker.node_id], broker.host, broker.port)

    def _close(self, node_id: int, reason: str) -> None:
        server = self._servers.pop(node_id)
        port = self._ports.pop(node_id)
        server.close()
        if reason != "shutdown":  # at shutdown the server closes every connection itself, gracefully
            self._close_connections(node_id)
        log.info("event=relay_listener_closed node_id=%d port=%d reason=%s", node_id, port, reason)

    def stop_accepting(self) -> None:
        for server in self._servers.values():
            server.close()

    async def close(self) -> None:
        async with self._lock:
            for node_id in list(self._servers):
                self._close(node_id, "shutdown")
