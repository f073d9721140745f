"""One client connection's connection to one upstream broker: request frames out as they came, response frames
back as bytes, never decoded.

Responses are read straight into buffers from the relay's `BufferPool`: the 4-byte size prefix is read first
(into a small staging buffer that also catches the small frames behind it), then the frame gets a pooled buffer
(small frames) or one of exactly its size, and the rest of it is received into that buffer directly
(`recv_into`, no copy). Each response fills the `PendingResponse` its request left in the client connection's
queue, so responses leave in request order whatever mix of local and relayed requests came before them.

Back-pressure both ways:
- upstream → client: while the client does not read (its transport has paused writing) we stop reading from
  the broker, so a consumer that stops reading holds the frames already read and nothing more;
- client → upstream: while the broker does not read (our transport to it paused writing) the client connection
  stops reading requests (`blocked`).
An allocation that cannot be served waits (reading paused) FIFO up to the pool's max block time; then the
client connection is closed with a log line.
"""

from __future__ import annotations

import asyncio
import collections
import struct
from collections.abc import Callable
from typing import Protocol, cast

from coordinator.relay.buffer_pool import BufferExhausted, BufferPool
from coordinator.security.clusters import ClusterSecurity
from coordinator.security.connections import ClusterAccessError, open_link
from protocol.transports import release_transport_cycle

_SIZE = struct.Struct(">i")
_CORRELATION = struct.Struct(">i")
# a response frame (size prefix included) -> the frame the client gets instead, or None to relay it unchanged
Rewrite = Callable[[memoryview], "bytes | None"]
_STAGING_BYTES = 16_384
_MIN_STAGING_FREE = 1_024
_CLIENT_ID = "kafka-group-coordinator-relay"  # what a broker sees on the SASL exchange of a secured link
_SECURED_CONNECT_TIMEOUT_MS = 30_000  # TLS and SASL together, per link
_TLS_UNSENT_BYTES = 65_536  # a TLS transport's pause limit (pause_when_anything_unsent)


def pause_when_anything_unsent(transport: asyncio.WriteTransport) -> None:
    """pause_writing() as soon as anything is left unsent, resume_writing() once all is sent (plain TCP). A TLS
    transport cannot do that: it counts its own handshake bytes (a TLS 1.3 server's session tickets are still
    pending at connection_made) and re-checks its limits only when written to or drained, so a pause on them
    would never end. There the limit is _TLS_UNSENT_BYTES of encrypted data (below it, what is unsent sits in the
    socket transport's buffer, itself bounded by asyncio's default limits)."""
    if transport.get_extra_info("sslcontext") is None:
        transport.set_write_buffer_limits(high=0)
    else:
        transport.set_write_buffer_limits(high=_TLS_UNSENT_BYTES)


class PendingResponse:
    """A place in a client connection's response order: filled with a whole frame (size prefix included)."""

    __slots__ = ("correlation_id", "frame", "buffer", "rewrite")

    def __init__(self, correlation_id: int, frame: bytes | memoryview | None = None,
                 rewrite: Rewrite | None = None) -> None:
        self.correlation_id = correlation_id
        self.frame = frame  # None until the response is here
        self.buffer: bytearray | None = None  # the pool buffer holding `frame`, given back once written
        self.rewrite = rewrite  # applied to the frame on arrival: new bytes, or None to relay it as it is


class RelayCounters:
    """Totals over every link of one relay, read by the metrics: requests forwarded and frame bytes each way
    (size prefixes included). Plain integers bumped on the loop: nothing to lock, nearly free."""

    __slots__ = ("requests", "bytes_to_upstream", "bytes_from_upstream")

    def __init__(self) -> None:
        self.requests = 0
        self.bytes_to_upstream = 0
        self.bytes_from_upstream = 0


class LinkOwner(Protocol):
    """What a link needs of its client connection (coordinator.server.connection.Connection)."""

    @property
    def peer(self) -> str: ...

    def relay_responses_ready(self) -> None: ...
    def relay_blocked_changed(self) -> None: ...
    def relay_failed(self, reason: str, detail: str) -> None: ...


class UpstreamLink(asyncio.BufferedProtocol):
    def __init__(self, owner: LinkOwner, pool: BufferPool, node_id: int, host: str, port: int,
                 max_frame_bytes: int, counters: RelayCounters | None = None,
                 security: ClusterSecurity | None = None) -> None:
        self.owner = owner
        self._security = security  # None: plain TCP; else TLS to `host` (its certificate must name it) and SASL
        self.counters = counters if counters is not None else RelayCounters()
        self.pool = pool
        self.node_id = node_id
        self.address = f"{host}:{port}"
        self._host, self._port = host, port
        self._max_frame_bytes = max_frame_bytes
        self._transport: asyncio.Transport | None = None
        self._connecting: asyncio.Task | None = None
        self._queued: list[bytes] = []  # requests that came before the connection was up
        self._awaiting: collections.deque[PendingResponse] = collections.deque()
        self._staging = bytearray(_STAGING_BYTES)
        self._staging_view = memoryview(self._staging)
        self._start = 0
        self._end = 0
        self._frame: bytearray | None = None  # the buffer the current frame is being received into
        self._frame_view: memoryview | None = None
        self._frame_filled = 0
        self._frame_size = 0
        self._memory_wait: asyncio.Task | None = None
        self._paused_for_memory = False
        self._paused_for_client = False
        self._reading_paused = False
        self._upstream_write_paused = False
        self._closed = False

    # ------------------------------------------------------------------------------------------ lifecycle

    def connect(self) -> None:
        loop = asyncio.get_running_loop()
        self._connecting = loop.create_task(self._connect(loop), name=f"relay-connect-{self.address}")

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            if self._security is None:
                await loop.create_connection(lambda: self, self._host, self._port)
            else:
                await open_link(self, self._host, self._port, self._security, client_id=_CLIENT_ID,
                                timeout_ms=_SECURED_CONNECT_TIMEOUT_MS)
        except ClusterAccessError as exc:
            self._fail("upstream_access_refused", f"node_id={self.node_id} upstream={self.address} error={exc}")
        except (OSError, asyncio.TimeoutError) as exc:
            self._fail("upstream_unreachable", f"node_id={self.node_id} upstream={self.address} error={exc!r}")
        finally:
            self._connecting = None  # the finished task would hold this link in a cycle (see close)

    @property
    def blocked(self) -> bool:
        """The client connection should stop reading requests: the broker is not taking ours."""
        return self._upstream_write_paused or (self._transport is None and bool(self._queued))

    @property
    def awaiting(self) -> int:
        return len(self._awaiting)

    def close(self) -> None:
        """Drop the upstream connection and every buffer this link holds (not those already handed over)."""
        if self._closed:
            return
        self._closed = True
        # Forget the tasks as well as cancelling them: a cancelled task keeps its CancelledError, whose traceback
        # holds the task's frame and so this link; kept here, that is a reference cycle, and cycles must not
        # outlive a connection (the GC policy freezes long-lived objects: a frozen cycle is never freed).
        connecting, self._connecting = self._connecting, None
        if connecting is not None and not connecting.done():
            connecting.cancel()
        memory_wait, self._memory_wait = self._memory_wait, None
        if memory_wait is not None and not memory_wait.done():
            memory_wait.cancel()
        if self._frame is not None:
            self.pool.deallocate(self._frame)
            self._frame = self._frame_view = None
        self._awaiting.clear()
        self._queued.clear()
        # let go of the transport here, not in connection_lost: uvloop does not call connection_lost for a
        # connection whose create_connection was cancelled after connection_made (a cycle again otherwise)
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.abort()
            release_transport_cycle(transport)

    def _fail(self, reason: str, detail: str) -> None:
        if not self._closed:
            self.close()
            self.owner.relay_failed(reason, detail)

    # ------------------------------------------------------------------------------------------ requests out

    def send(self, frame: bytes, correlation_id: int, expects_response: bool, *,
             rewrite: Rewrite | None = None) -> PendingResponse | None:
        """Forward one request frame (size prefix included); its place in the response order, if answered
        (`rewrite`: what the response goes through before the client sees it)."""
        counters = self.counters
        counters.requests += 1
        counters.bytes_to_upstream += len(frame)
        pending = None
        if expects_response:
            pending = PendingResponse(correlation_id, rewrite=rewrite)
            self._awaiting.append(pending)
        if self._transport is None:
            self._queued.append(frame)
        else:
            self._transport.write(frame)
        return pending

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)  # a TCP connection's transport
        if self._closed:
            stream.abort()
            return
        self._transport = stream
        # pause as soon as anything is left unsent: the client then stops reading requests (back-pressure)
        pause_when_anything_unsent(stream)
        if self._queued:
            queued, self._queued = self._queued, []
            stream.write(b"".join(queued))
        self._apply_reading()
        self.owner.relay_blocked_changed()

    def pause_writing(self) -> None:
        self._upstream_write_paused = True
        self.owner.relay_blocked_changed()

    def resume_writing(self) -> None:
        self._upstream_write_paused = False
        self.owner.relay_blocked_changed()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            release_transport_cycle(self._transport)
        self._transport = None
        if not self._closed:
            self._fail("upstream_closed", f"node_id={self.node_id} upstream={self.address} awaiting={len(self._awaiting)} "
                                          f"error={exc!r}")

    def eof_received(self) -> bool:
        return False

    # ------------------------------------------------------------------------------------------ responses in

    def pause_for_client(self, paused: bool) -> None:
        """The client stopped (or resumed) reading: stop (or resume) reading from the broker."""
        self._paused_for_client = paused
        self._apply_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame_view is not None:
            return self._frame_view[self._frame_filled : self._frame_size]
        if len(self._staging) - self._end < _MIN_STAGING_FREE:
            self._compact()
        return self._staging_view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.counters.bytes_from_upstream += nbytes
        delivered = False
        if self._frame_view is not None:
            self._frame_filled += nbytes
            if self._frame_filled == self._frame_size:
                delivered = self._deliver_current()
        else:
            self._end += nbytes
            delivered = self._parse_staged()
        if delivered:
            self.owner.relay_responses_ready()

    def _parse_staged(self) -> bool:
        """Hand out every complete frame in the staging buffer; start direct receiving for a partial one."""
        delivered = False
        while not self._closed and self._frame is None and self._end - self._start >= 4:
            (size,) = _SIZE.unpack_from(self._staging, self._start)
            if size < 4 or size > self._max_frame_bytes:
                self._fail("upstream_bad_frame", f"node_id={self.node_id} frame_size={size}")
                return delivered
            if not self._reserve(4 + size):
                break
            available = min(self._end - self._start, self._frame_size)
            frame = self._frame
            assert frame is not None  # _reserve() gave it
            frame[:available] = self._staging_view[self._start : self._start + available]
            self._start += available
            self._frame_filled = available
            if available == self._frame_size:
                delivered = self._deliver_current() or delivered
        if self._start == self._end:
            self._start = self._end = 0
        return delivered

    def _reserve(self, frame_size: int) -> bool:
        """Take a pool buffer for the next frame; False (reading paused, waiting) if memory is short."""
        try:
            buffer = self.pool.try_allocate(frame_size)
        except BufferExhausted as exc:
            self._fail("relay_buffer_exhausted", f"node_id={self.node_id} {exc}")
            return False
        if buffer is None:
            self._paused_for_memory = True
            self._apply_reading()
            self._memory_wait = asyncio.get_running_loop().create_task(self._wait_for_memory(frame_size))
            return False
        self._use_buffer(buffer, frame_size)
        return True

    def _use_buffer(self, buffer: bytearray, frame_size: int) -> None:
        self._frame = buffer
        self._frame_view = memoryview(buffer)
        self._frame_size = frame_size
        self._frame_filled = 0

    async def _wait_for_memory(self, frame_size: int) -> None:
        try:
            buffer = await self.pool.allocate(frame_size)
        except BufferExhausted as exc:
            self._memory_wait = None
            self._fail("relay_buffer_exhausted", f"node_id={self.node_id} {exc}")
            return
        if self._closed:
            self.pool.deallocate(buffer)
            return
        self._memory_wait = None
        self._paused_for_memory = False
        self._use_buffer(buffer, frame_size)
        available = min(self._end - self._start, frame_size)
        buffer[:available] = self._staging_view[self._start : self._start + available]
        self._start += available
        self._frame_filled = available
        delivered = self._deliver_current() if available == frame_size else False
        delivered = self._parse_staged() or delivered
        if delivered:
            self.owner.relay_responses_ready()
        self._apply_reading()

    def _deliver_current(self) -> bool:
        buffer, size = self._frame, self._frame_size
        self._frame = self._frame_view = None
        assert buffer is not None
        if not self._awaiting:
            self.pool.deallocate(buffer)
            self._fail("upstream_unexpected_response", f"node_id={self.node_id} frame_size={size}")
            return False
        pending = self._awaiting.popleft()
        (correlation_id,) = _CORRELATION.unpack_from(buffer, 4)
        if correlation_id != pending.correlation_id:
            self.pool.deallocate(buffer)
            self._fail("upstream_correlation_mismatch",
                       f"node_id={self.node_id} expected={pending.correlation_id} got={correlation_id}")
            return False
        pending.buffer = buffer
        pending.frame = memoryview(buffer)[:size]
        if pending.rewrite is not None:
            try:
                rewritten = pending.rewrite(pending.frame)
            except ValueError as exc:
                pending.frame = pending.buffer = None
                self.pool.deallocate(buffer)
                self._fail("upstream_bad_response", f"node_id={self.node_id} {exc}")
                return False
            if rewritten is not None:
                pending.frame, pending.buffer = rewritten, None
                self.pool.deallocate(buffer)
        return True

    def _compact(self) -> None:
        pending = self._end - self._start
        self._staging[:pending] = self._staging_view[self._start : self._end]
        self._start, self._end = 0, pending

    def _apply_reading(self) -> None:
        if self._transport is None:
            return
        pause = self._paused_for_memory or self._paused_for_client
        if pause and not self._reading_paused:
            self._transport.pause_reading()
            self._reading_paused = True
        elif not pause and self._reading_paused:
            self._transport.resume_reading()
            self._reading_paused = False
