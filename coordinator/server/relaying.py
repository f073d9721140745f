"""A client connection's relay side (coordinator/relay): its link to the upstream broker the listener stands for,
and the one response order that relayed and local responses share.

Relayed requests do not hold the connection (they pipeline, as the broker behind them sees them in order): each
leaves a PendingResponse in `pending` that the link fills with the response's bytes when it arrives. A local
response produced while relayed ones are still due waits behind them (`LocalResponse`), so every response leaves
in request order. A relayed frame sits in a pool buffer; the buffer goes back to the pool once the transport has
taken the frame, or is `held` while the transport may still be sending from it.
"""

from __future__ import annotations

import asyncio
import collections
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from coordinator.relay.errors import UpstreamUnavailable
from coordinator.relay.group_configs import ALTERING_CONFIGS
from coordinator.relay.upstream import LinkOwner, PendingResponse, UpstreamLink
from coordinator.relay.versions import Route, produce_expects_response
from coordinator.security.sasl_passthrough import HOLD
from protocol.errors import ProtocolError

if TYPE_CHECKING:
    from coordinator.relay.relay import Relay
    from coordinator.security.sasl_passthrough import SaslPassthrough

_CORRELATION_ID = struct.Struct(">i")
_SIZE = struct.Struct(">i")
_VERSION = struct.Struct(">h")
_PRODUCE = 0


class LocalResponse:
    """A response of ours queued behind relayed responses still on their way (same shape as PendingResponse)."""

    __slots__ = ("frame", "buffer")

    def __init__(self, frame: bytes) -> None:
        self.frame: bytes | None = frame
        self.buffer: bytearray | None = None


class RelaySide:
    """Created per client connection when the coordinator relays; the link opens with the first relayed request.

    Holds no reference to its connection (only the link does, until close()): the pair must not form a reference
    cycle, which the GC policy's freeze would keep forever (coordinator/runtime_health.py)."""

    __slots__ = ("relay", "upstream_node", "link", "reauth_link", "pending", "held")

    def __init__(self, relay: Relay, upstream_node: int | None) -> None:
        self.relay = relay
        self.upstream_node = upstream_node  # None: the bootstrap listener (the known brokers in turn)
        self.link: UpstreamLink | None = None
        # a SASL re-authentication's own connection to the link's broker, while it runs (security/sasl_passthrough)
        self.reauth_link: UpstreamLink | None = None
        self.pending: collections.deque[PendingResponse | LocalResponse] = collections.deque()
        self.held: list[bytearray] = []  # pool buffers the transport may still be sending from

    def route(self, api_key: int, api_version: int) -> Route:
        """Raises UnknownApiKey/UnsupportedVersion for what the relay does not advertise."""
        return self.relay.route(api_key, api_version)

    def local(self, api_key: int, api_version: int) -> bool:
        """Whether the relay has this request handled here (Route.LOCAL), not sent upstream or refused."""
        try:
            return self.relay.route(api_key, api_version) is Route.LOCAL
        except ProtocolError:
            return False

    def settled(self) -> bool:
        """No answer of this connection is due (every relayed response written to the client: none waiting for
        the broker, none arrived and unsent, no local answer queued behind them) and the broker takes requests:
        an answer of ours written now leaves in request order, and the frame loop would read a request now."""
        return not self.pending and not self.blocked()

    def blocked(self) -> bool:
        """The broker is not taking requests (its transport paused our writes): stop reading the client's."""
        reauth_link = self.reauth_link
        return (self.link is not None and self.link.blocked) or (reauth_link is not None and reauth_link.blocked)

    def forward(self, frame: bytes, api_key: int, owner: LinkOwner, *, fresh: bool = False) -> tuple[str, str] | None:
        """Sends a relayed request upstream, its response's place taken in the order; (reason, detail) when the
        client connection (`owner`, told when responses arrive) must close instead. `fresh`: over the
        re-authentication's own connection to the link's broker (opened by its first request)."""
        link = self.reauth_link if fresh else self.link
        if link is None:
            node = self.link.node_id if fresh and self.link is not None else self.upstream_node
            try:
                link = self.relay.open_link(owner, node)
            except UpstreamUnavailable as exc:
                return "upstream_unavailable", str(exc)
            if fresh:
                self.reauth_link = link
            else:
                self.link = link
        expects_response = True
        rewrite = None
        if api_key == _PRODUCE:
            try:
                expects_response = produce_expects_response(frame, 0)
            except (ValueError, IndexError) as exc:
                return "CorruptRequest", f"produce request: {exc}"
            (version,) = _VERSION.unpack_from(frame, 2)
            rewrite = self.relay.produce_rewrite(version)
        elif api_key in ALTERING_CONFIGS:  # the groups whose configurations it alters are read again
            (version,) = _VERSION.unpack_from(frame, 2)
            rewrite = self.relay.config_alteration(api_key, version)
        (correlation_id,) = _CORRELATION_ID.unpack_from(frame, 4)
        pending = link.send(_SIZE.pack(len(frame)) + frame, correlation_id, expects_response, rewrite=rewrite)
        if pending is not None:
            self.pending.append(pending)
        return None

    def queue_local(self, frame: bytes) -> None:
        self.pending.append(LocalResponse(frame))

    def send_ready(self, transport: asyncio.Transport, can_send: Callable[[], bool],
                   sasl: SaslPassthrough | None = None) -> int:
        """Writes the responses at the head of the order that are here, while `can_send()` (a write may pause
        the transport); returns how many were written. On a SASL listener the broker's answers to the exchange
        move `sasl`'s state before they reach the client."""
        pending = self.pending
        pool = self.relay.pool
        sent = 0
        while pending and can_send():
            frame = pending[0].frame
            if frame is None:  # the next response in order has not arrived yet
                break
            if sasl is not None and sasl.awaiting:
                replaced = sasl.observe(getattr(pending[0], "correlation_id", None), frame)
                if replaced is HOLD:  # sent once the principal is known (the connection is woken)
                    break
                frame = replaced or frame
                if sasl.fresh_link_done:
                    sasl.fresh_link_done = False
                    self.close_reauth_link()
            response = pending.popleft()
            transport.write(frame)
            sent += 1
            buffer = response.buffer
            if buffer is not None:
                response.frame = response.buffer = None
                if transport.get_write_buffer_size():
                    self.held.append(buffer)  # the transport may still be sending from it
                else:
                    pool.deallocate(buffer)
        return sent

    def release_held(self) -> None:
        if self.held:
            held, self.held = self.held, []
            for buffer in held:
                self.relay.pool.deallocate(buffer)

    def pause_for_client(self, paused: bool) -> None:
        for link in (self.link, self.reauth_link):
            if link is not None:
                link.pause_for_client(paused)

    def close_reauth_link(self) -> None:
        if self.reauth_link is not None:
            link, self.reauth_link = self.reauth_link, None
            link.close()

    def close(self) -> None:
        """The client connection is gone: close the link and give every buffer back."""
        self.close_reauth_link()
        if self.link is not None:
            # the link points back at the connection (its owner): let go of it (see the class docstring)
            link, self.link = self.link, None
            link.close()
        pool = self.relay.pool
        while self.pending:
            buffer = self.pending.popleft().buffer
            if buffer is not None:
                pool.deallocate(buffer)
        held, self.held = self.held, []
        for buffer in held:
            pool.deallocate(buffer)
