"""Our own accept path: at most `ACCEPTS_PER_TURN` connections accepted per socket and loop turn, on asyncio and uvloop.

`loop.create_server` accepts as the loop likes: asyncio up to `backlog` connections a turn, uvloop (libuv) until
the kernel's queue is empty, so a connect storm of thousands is accepted, and its transports made, in one callback
while heartbeats and timers wait. Here the listening socket is watched with `add_reader` (level-triggered on both
loops): a turn accepts a bounded batch and the rest stay in the kernel's queue, whose size (`listen_backlog`, up to
somaxconn) is what absorbs the storm, for the next turn. Each accepted socket becomes a transport through
`loop.connect_accepted_socket`, as create_server would make it (TLS, where the listener has it, by our own layer:
security/tls_transport.py). One Acceptor serves every socket of a listener (a host name's addresses, e.g.
127.0.0.1 and ::1), each bounded alike.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Callable, Sequence

from coordinator.security.tls_transport import accept_tls

log = logging.getLogger("coordinator.server")

ACCEPTS_PER_TURN = 128
_RETRY_AFTER_S = 1.0  # out of descriptors or memory: accepting pauses this long (asyncio's own choice)
_SETTLE_S = 5.0
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Acceptor:
    """Listening sockets served by bounded accepts. `sockets`, `close()` and `wait_closed()` as asyncio's Server."""

    def __init__(self, sockets: Sequence[socket.socket], protocol_factory: Callable[[], asyncio.BaseProtocol], *,
                 ssl_context: ssl.SSLContext | None = None, per_turn: int = ACCEPTS_PER_TURN) -> None:
        if not sockets:
            raise ValueError("an Acceptor needs a listening socket")
        self._loop = asyncio.get_running_loop()
        self.sockets: tuple[socket.socket, ...] = tuple(sockets)
        self._protocol_factory = protocol_factory
        self._ssl = ssl_context
        self._per_turn = per_turn
        self._watching = False
        self._retry: asyncio.TimerHandle | None = None
        self._making: set[asyncio.Task[object]] = set()  # accepted sockets whose transport is being made

    def start_serving(self) -> None:
        if self.sockets and not self._watching:
            for listening in self.sockets:
                self._loop.add_reader(listening.fileno(), self._accept_ready, listening)
            self._watching = True

    def _stop_watching(self) -> None:
        if self._watching:
            for listening in self.sockets:
                self._loop.remove_reader(listening.fileno())
        self._watching = False

    def _accept_ready(self, listening: socket.socket) -> None:
        for _ in range(self._per_turn):
            if not self._watching:
                return
            try:
                conn, _address = listening.accept()
            except (BlockingIOError, InterruptedError):
                return  # the queue is empty
            except ConnectionAbortedError:
                continue  # the peer gave up while queued
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    log.error("event=accept_failed error=%r", exc)
                    return  # the socket stays watched: the next turn tries again, as asyncio's accept does
                log.error("event=accept_paused error=%s retry_after_s=%.1f", exc, _RETRY_AFTER_S)
                self._stop_watching()
                self._retry = self._loop.call_later(_RETRY_AFTER_S, self._resume)
                return
            self._make_transport(conn)

    def _resume(self) -> None:
        self._retry = None
        self.start_serving()

    def _make_transport(self, conn: socket.socket) -> None:
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as create_server's transports
            making = self._loop.create_task(
                self._loop.connect_accepted_socket(self._protocol_factory, conn) if self._ssl is None
                else accept_tls(self._loop, self._protocol_factory, conn, self._ssl))
        except Exception:
            conn.close()
            raise
        self._making.add(making)
        making.add_done_callback(self._made)

    def _made(self, making: asyncio.Task[object]) -> None:
        self._making.discard(making)
        if making.cancelled():
            return
        exc = making.exception()
        if exc is not None:  # a failed TLS handshake, a peer gone before its transport was made
            log.info("event=connection_closed reason=accept_failed error=%r", exc)

    def close(self) -> None:
        """Stop accepting and close the listening socket. Connections already made carry on; a socket whose
        transport is still being made (its TLS handshake) is closed: it has sent no request yet."""
        self._stop_watching()
        for making in self._making:
            making.cancel()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        for listening in self.sockets:
            listening.close()
        self.sockets = ()

    async def wait_closed(self) -> None:
        """After close(): until the cancelled transports have let go of their sockets (bounded)."""
        if self._making:
            await asyncio.wait(set(self._making), timeout=_SETTLE_S)
