"""TLS session resumption on the connections we open to a cluster's brokers (the relay's links, its control
connection, the start-up check): a later connection to the same broker offers a session ticket an earlier one
received, and a broker that accepts it skips the certificate exchange, its signature and our verification of the
chain.

Which ticket to offer: Kafka's broker gives every network thread (`num.network.threads`, default 3) its own TLS
context, hence its own ticket keys, and hands accepted connections to those threads in turn. A ticket therefore
resumes only on the thread that issued it: the one that took the connection `lag` accepts earlier, lag being the
number of threads when nobody else connects meanwhile. We offer the newest ticket from a connection a multiple of
`lag` connections back. A lag not yet proven moves on at the first ticket turned down; one that resumed a session
moves on only after _MISSES_TO_MOVE refusals in a row (another client's connection in between shifts the turn
once). A server with one context, as a TLS proxy usually has, keeps lag 1. Under many other clients' connections
the thread is a matter of chance; a ticket turned down costs nothing but its bytes in the ClientHello (a full
handshake follows, no extra round trip).

asyncio's and uvloop's TLS transports make their `ssl.SSLObject` with `context.wrap_bio(...)` and pass no session:
the context given to them is a per-connection stand-in whose wrap_bio adds it. A ticket arrives after the
handshake (TLS 1.3's NewSessionTicket, read with the first response), so a connection's session is taken lazily,
when a later connection to the same broker needs one. Taking it is not cheap (Python copies the session, the
broker's certificate included: 0.2–0.5 ms, as much as resuming saves), so a session taken is offered again, to
the connections of its thread's turn, for _REUSE_S, and dropped once turned down (Kafka's stateless tickets may be
used more than once). Tickets only (TLS 1.3's, TLS 1.2's RFC 5077 ones): TLS 1.2 session ids are not offered.
`completed(context)`, once the handshake is done, counts it and learns from it.
"""

from __future__ import annotations

import collections
import ssl
import time
from typing import Any, cast

_RECENT = 32  # connections remembered per broker: a ticket is offered from at most this many connections back
_MAX_LAG = 8  # network threads per broker listener we look for
_MISSES_TO_MOVE = 3
_REUSE_S = 600.0


class _Handshake:
    __slots__ = ("sequence", "ssl_object", "session", "taken_at")

    def __init__(self, sequence: int, ssl_object: ssl.SSLObject) -> None:
        self.sequence = sequence
        self.ssl_object: ssl.SSLObject | None = ssl_object  # until its session is taken (or found without ticket)
        self.session: ssl.SSLSession | None = None
        self.taken_at = 0.0


class _Broker:
    __slots__ = ("next_sequence", "lag", "proven", "misses", "recent")

    def __init__(self) -> None:
        self.next_sequence = 0
        self.lag = 1
        self.proven = False  # a ticket offered at this lag was taken
        self.misses = 0  # tickets turned down in a row
        self.recent: collections.deque[_Handshake] = collections.deque(maxlen=_RECENT)


class TlsSessions:
    """Session tickets of one TLS context's connections, per broker address. Used on the event loop only."""

    def __init__(self) -> None:
        self._brokers: dict[tuple[str, int], _Broker] = {}
        self.handshakes = 0  # completed, ours
        self.resumed = 0  # of those, resuming a session

    def context_for(self, context: ssl.SSLContext, host: str, port: int) -> ssl.SSLContext:
        """What to give create_connection(ssl=...) for one connection to host:port."""
        return cast(ssl.SSLContext, _ResumingContext(context, self, (host, port)))

    def completed(self, context: ssl.SSLContext | None) -> bool | None:
        """After the TLS handshake of a connection made with context_for's context: whether it resumed a session
        (None: not such a connection). A ticket turned down moves the broker's lag on (above)."""
        if not isinstance(context, _ResumingContext) or context.ssl_object is None:
            return None
        resumed = context.ssl_object.session_reused
        self.handshakes += 1
        self.resumed += resumed
        offered = context.offered
        if offered is not None:
            broker = self._brokers[context.address]
            if resumed:
                broker.proven, broker.misses = True, 0
            else:
                offered.session = None  # not offered again
                broker.misses += 1
                if not broker.proven or broker.misses >= _MISSES_TO_MOVE:
                    broker.lag = broker.lag % _MAX_LAG + 1
                    broker.proven, broker.misses = False, 0
        return resumed

    def wrap(self, wrapper: _ResumingContext, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO,
             server_hostname: str | None) -> ssl.SSLObject:
        broker = self._brokers.get(wrapper.address)
        if broker is None:
            broker = self._brokers[wrapper.address] = _Broker()
        sequence = broker.next_sequence
        broker.next_sequence += 1
        offered = _pick(broker, sequence, time.monotonic())
        ssl_object = wrapper.context.wrap_bio(incoming, outgoing, server_side=False,
                                              server_hostname=server_hostname,
                                              session=offered.session if offered is not None else None)
        broker.recent.append(_Handshake(sequence, ssl_object))
        wrapper.ssl_object, wrapper.offered = ssl_object, offered
        return ssl_object


def _pick(broker: _Broker, sequence: int, now: float) -> _Handshake | None:
    """The earlier connection of this one's turn (a multiple of lag back) whose session to offer: one taken
    already, else the newest whose ticket has come (taken now)."""
    lag = broker.lag
    turn = [handshake for handshake in reversed(broker.recent) if (sequence - handshake.sequence) % lag == 0]
    for handshake in turn:
        if handshake.session is not None and now - handshake.taken_at < _REUSE_S:
            return handshake
    for handshake in turn:
        ssl_object = handshake.ssl_object
        if ssl_object is None or ssl_object.version() is None:  # looked at already, or still in its handshake
            continue
        handshake.ssl_object = None  # looked at once: taking a session copies it
        session = ssl_object.session
        if session is not None and session.has_ticket:
            handshake.session, handshake.taken_at = session, now
            return handshake
    return None


class _ResumingContext:
    """An SSLContext for one connection: everything the shared context's, wrap_bio with a session to resume."""

    def __init__(self, context: ssl.SSLContext, sessions: TlsSessions, address: tuple[str, int]) -> None:
        self.context = context
        self.address = address
        self.ssl_object: ssl.SSLObject | None = None  # this connection's, once wrap_bio made it
        self.offered: _Handshake | None = None  # the earlier connection whose session it offered
        self._sessions = sessions

    def __getattr__(self, name: str) -> Any:
        return getattr(self.context, name)

    def wrap_bio(self, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO, server_side: bool = False,
                 server_hostname: str | None = None) -> ssl.SSLObject:
        if server_side:
            return self.context.wrap_bio(incoming, outgoing, server_side=True, server_hostname=server_hostname)
        return self._sessions.wrap(self, incoming, outgoing, server_hostname)
