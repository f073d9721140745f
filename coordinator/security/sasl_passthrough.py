"""SASL on our listeners by passing the client's exchange through to the cluster: the client's SaslHandshake and
SaslAuthenticate requests go, byte for byte, over its own connection's upstream link (opened with TLS only, never
with the coordinator's credentials), and the broker decides. We keep no credential store.

What this connection may send is Kafka's server-side sequence (SaslServerAuthenticator): ApiVersions at any time;
SaslHandshake (v1: tokens travel in SaslAuthenticate, KIP-152) and then SaslAuthenticate until the broker's final
answer; any other request before the exchange completed closes the connection. We learn completion from the
broker's answers, by mechanism: PLAIN after its one successful round, SCRAM once the server-final message
(`v=...`) came with no error, OAUTHBEARER when the broker's answer carries no challenge. A mechanism whose end we
cannot recognise is answered UNSUPPORTED_SASL_MECHANISM with the ones we can, and the connection closed, as Kafka
does. SaslHandshake v0 (raw tokens outside Kafka framing) is refused and the connection closed.

After completion the connection serves everything (group APIs here, the rest relayed). The principal, for the
log, is the name in the client's own first message (PLAIN's authcid, SCRAM's `n=`, OAUTHBEARER's token's `sub`
claim), never its password; it is the connection's principal for authorization once the broker accepted the
exchange. A delegation token's (SCRAM `tokenauth=true`) names the token, not its owner, Kafka's principal: the owner
is asked of the cluster (DescribeDelegationToken) while the broker checks the token, and the broker's final answer
waits for it (HOLD); an owner we may not see fails the exchange.

KIP-368 session lifetime and re-authentication, as Kafka's broker (SaslServerAuthenticator, KafkaChannel,
SocketServer): the session lasts min(our `connections.max.reauth.ms`, the broker's session lifetime), the broker's
already bounded by the credential's expiry (an OAUTHBEARER token's `exp`); none when both are 0. The broker's final
SaslAuthenticate answer (v1+) is rewritten to carry our lifetime. With a session that expires, a SaslHandshake
after completion begins a re-authentication (at most one a second, counted from the previous one's start); the
mechanism must stay (else Kafka answers the handshake and closes on the next request) and so must the principal
(else SASL_AUTHENTICATION_FAILED, "Cannot change principals ..."). Once expired, any request but a SaslHandshake
that begins a re-authentication closes the connection. A handshake that cannot begin one is answered
ILLEGAL_SASL_STATE, the connection kept (Kafka's KafkaApis answer).

Where a re-authentication goes: over the connection's upstream link when the broker's session on it expires (the
broker re-authenticates that session in place); else the broker would refuse a second exchange on the link
(ILLEGAL_SASL_STATE), so the exchange runs on a fresh upstream connection to the same broker
(`reauth_on_fresh_link`), closed once it completed: the credentials are checked by the cluster again, and the
link, whose broker session never expires and has the same principal, stays.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import logging
import time
import types
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from coordinator.security.principals import oauthbearer_subject
from protocol import apis
from protocol.codec import RequestHeader, decode_request, decode_response, encode_response, peek_header
from protocol.messages import build, error

log = logging.getLogger("coordinator.security")

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
_API_VERSIONS = 18
_UNSUPPORTED_SASL_MECHANISM = 33
_ILLEGAL_SASL_STATE = 34
_SASL_AUTHENTICATION_FAILED = 58
_MIN_REAUTH_INTERVAL_MS = 1_000  # KafkaChannel.MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS
# SaslServerAuthenticator's answer to bad credentials (it says no more, so as not to tell which part was wrong)
_GENERIC_FAILURE = "Authentication failed during {} due to invalid credentials with SASL mechanism {}"
PASSABLE_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


def weak_method(method: Callable[[], None]) -> Callable[[], Callable[[], None] | None]:
    """A weak reference to a bound method: called, the method, or None once its object is gone. A compiled class's
    method (mypyc, coordinator/compiled.py) is bound as a builtin with `__self__`, which `weakref.WeakMethod`
    refuses: its object is referenced weakly and the method looked up again by name."""
    if isinstance(method, types.MethodType):
        return weakref.WeakMethod(method)
    owner = weakref.ref(method.__self__)  # type: ignore[attr-defined]
    name = method.__name__

    def bound() -> Callable[[], None] | None:
        target = owner()
        return None if target is None else getattr(target, name)

    return bound


@dataclass(frozen=True)
class ReauthLimits:
    """`connections.max.reauth.ms` of one listener per SASL mechanism, as Kafka's SaslChannelBuilder reads it:
    `listener.name.<listener>.<mechanism>.connections.max.reauth.ms`, else the listener's own value
    (`listener.name.<listener>.connections.max.reauth.ms`, else `connections.max.reauth.ms`); 0: none."""

    default_ms: int = 0
    by_mechanism: tuple[tuple[str, int], ...] = ()  # (mechanism in upper case, ms)

    def for_mechanism(self, mechanism: str | None) -> int:
        wanted = (mechanism or "").upper()
        return next((limit for name, limit in self.by_mechanism if name == wanted), self.default_ms)


class ExpiredConnections:
    """Connections closed because their SASL session expired and the client used them for anything but a
    re-authentication: Kafka's `expired-connections-killed-count` (socket-server-metrics), process-wide as the
    broker's is across its processors."""

    killed = 0


class State(enum.Enum):
    INITIAL = "initial"  # nothing but ApiVersions and SaslHandshake
    AUTHENTICATING = "authenticating"  # a handshake passed: SaslAuthenticate until the broker's final answer
    COMPLETE = "complete"
    # a re-authentication asked for another mechanism (Kafka's state of that name), or failed: the next request
    # closes the connection
    REAUTH_FAILED = "reauth_failed"


class Refusal(Exception):
    """The client broke Kafka's SASL sequence: close its connection (after `reply`, if any)."""

    def __init__(self, reason: str, reply: bytes | None = None, *, kind: str = "sasl_sequence") -> None:
        super().__init__(reason)
        self.reply = reply
        self.kind = kind  # the close's reason in the log line


class SaslPassthrough:
    __slots__ = ("state", "mechanism", "principal", "_awaited", "peer", "enabled", "claim", "max_reauth_ms",
                 "_now_ms", "expires_at_ms", "link_lifetime_ms", "_reauth_started_ms", "_previous", "_failure",
                 "reauth_on_fresh_link", "fresh_link_done", "close_reason", "listener", "_token_owner",
                 "_owner_lookup", "_look_up_owner", "_wake", "_first_token_seen")

    def __init__(self, peer: str = "?", enabled: tuple[str, ...] = PASSABLE_MECHANISMS, claim: str = "sub", *,
                 max_reauth_ms: int | ReauthLimits = 0, now_ms: Callable[[], int] | None = None,
                 token_owner: Callable[[str], Awaitable[str | None]] | None = None,
                 wake: Callable[[], None] | None = None) -> None:
        self.enabled = enabled  # sasl.enabled.mechanisms of our listener
        self.claim = claim  # sasl.oauthbearer.sub.claim.name: the OAUTHBEARER token's claim naming the principal
        # connections.max.reauth.ms of our listener, by mechanism (0: none of ours)
        self.max_reauth_ms = max_reauth_ms if isinstance(max_reauth_ms, ReauthLimits) else ReauthLimits(max_reauth_ms)
        self._now_ms = now_ms if now_ms is not None else _monotonic_ms
        self.state = State.INITIAL
        self.mechanism: str | None = None
        self.principal: str | None = None
        self._awaited: dict[int, tuple[int, int]] = {}  # correlation id -> (api key, version) of SASL requests
        self.peer = peer
        self.listener = "?"  # our listener's address, for the log (the coordinator's or a broker's)
        self.expires_at_ms: int | None = None  # our session's end (monotonic ms); None: it does not expire
        self.link_lifetime_ms = 0  # the broker's session lifetime on the connection's upstream link (0: none)
        self._reauth_started_ms: int | None = None  # KafkaChannel's lastReauthenticationStartNanos
        self._previous: tuple[str, str | None] | None = None  # (mechanism, principal) while re-authenticating
        self._failure = ""
        self.reauth_on_fresh_link = False  # this re-authentication's exchange goes to a fresh upstream connection
        self.fresh_link_done = False  # ... which has completed: the relay side closes it
        self.close_reason: str | None = None  # close the connection once the answer just observed is written
        # Delegation tokens (SCRAM tokenauth=true): the principal is the token's owner, asked of the cluster
        # (`token_owner`, DescribeDelegationToken) while the broker checks the token; the final answer waits for
        # it, then `wake` (weakly held: the connection owns this object) sends it on.
        self._look_up_owner = token_owner
        self._wake = weak_method(wake) if wake is not None and hasattr(wake, "__self__") else None
        self._owner_lookup: asyncio.Task[None] | None = None
        self._token_owner: str | None = None  # "" once looked up and not found
        self._first_token_seen = False

    @property
    def awaiting(self) -> bool:
        return bool(self._awaited)

    def on_fresh_link(self, api_key: int) -> bool:
        """Whether this request (admitted) belongs to a re-authentication running on a fresh upstream connection."""
        return (self.reauth_on_fresh_link and self._previous is not None and self.state is State.AUTHENTICATING
                and api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE))

    def admit(self, frame: bytes) -> bytes | None:
        """A request of this connection (size prefix removed), before it is handled or relayed: Refusal if
        Kafka's sequence forbids it here; a response frame when it is answered here and goes no further."""
        api_key, version, correlation_id = peek_header(frame)
        if self.state is State.COMPLETE and self.expires_at_ms is not None:
            now = self._now_ms()
            if api_key == SASL_HANDSHAKE and self._may_reauthenticate(now):
                return self._reauthenticate(frame, version, correlation_id, now)
            if now > self.expires_at_ms:
                ExpiredConnections.killed += 1
                raise Refusal(f"the SASL session expired {now - self.expires_at_ms} ms ago (connections.max."
                              f"reauth.ms or the credential's lifetime) and the client did not re-authenticate; "
                              f"api_key={api_key}", kind="sasl_session_expired")
        if self.state is State.REAUTH_FAILED:
            raise Refusal(self._failure)
        if api_key == _API_VERSIONS:
            return None
        if api_key == SASL_HANDSHAKE:
            if self.state is State.COMPLETE:  # no session expiry, or a second one within a second
                decode_request(frame)  # a version we cannot read closes the connection
                return _handshake_reply(version, correlation_id, _ILLEGAL_SASL_STATE, ())
            self._handshake(frame, version, correlation_id)
            return None
        if api_key == SASL_AUTHENTICATE:
            if self.state is State.INITIAL:
                raise Refusal("SaslAuthenticate before SaslHandshake (ILLEGAL_SASL_STATE)")
            if not self._first_token_seen and self.state is State.AUTHENTICATING:
                self._first_token_seen = True
                token = decode_request(frame).body.auth_bytes
                if _delegation_token(self.mechanism, token):
                    self._start_owner_lookup(_principal(self.mechanism, token, self.claim), version, correlation_id)
                else:
                    self.principal = _principal(self.mechanism, token, self.claim)
            self._awaited[correlation_id] = (api_key, version)
            return None
        if self.state is not State.COMPLETE:
            raise Refusal(f"api_key={api_key} before SASL authentication completed (state {self.state.value})")
        return None

    def _may_reauthenticate(self, now: int) -> bool:
        """KafkaChannel.maybeBeginServerReauthentication: a session that expires, not within a second of the
        previous re-authentication's start."""
        started = self._reauth_started_ms
        return started is None or now - started >= _MIN_REAUTH_INTERVAL_MS

    def _reauthenticate(self, frame: bytes, version: int, correlation_id: int, now: int) -> bytes | None:
        self._reauth_started_ms = now
        if version == 0:
            self._handshake(frame, version, correlation_id)  # refused
        mechanism = decode_request(frame).body.mechanism
        previous = self.mechanism
        assert previous is not None
        if mechanism != previous:
            # Kafka accepts the handshake (for an enabled mechanism) and fails the re-authentication on the next
            # request, without an answer
            self.state = State.REAUTH_FAILED
            self._failure = (f"SASL mechanism '{mechanism}' requested by client is not supported for "
                             f"re-authentication of mechanism '{previous}'")
            if mechanism not in self.enabled:
                raise Refusal(f"SASL mechanism {mechanism!r} is not enabled (UNSUPPORTED_SASL_MECHANISM)",
                              _handshake_reply(version, correlation_id, _UNSUPPORTED_SASL_MECHANISM, self.enabled))
            return _handshake_reply(version, correlation_id, 0, self.enabled)
        self._previous = (previous, self.principal)
        self.reauth_on_fresh_link = self.link_lifetime_ms == 0
        self.fresh_link_done = False
        log.info("event=sasl_reauthentication_started peer=%s listener=%s mechanism=%s principal=User:%s upstream=%s",
                 self.peer, self.listener, mechanism, self.principal,
                 "fresh_connection" if self.reauth_on_fresh_link else "link")
        self._handshake(frame, version, correlation_id)
        return None

    def _handshake(self, frame: bytes, version: int, correlation_id: int) -> None:
        if version == 0:
            raise Refusal("SaslHandshake v0 (tokens outside Kafka's framing) is not supported: use a client that "
                          "sends SaslAuthenticate (Kafka 1.0+)")
        mechanism = decode_request(frame).body.mechanism
        if mechanism not in self.enabled:
            reply = _handshake_reply(version, correlation_id, _UNSUPPORTED_SASL_MECHANISM, self.enabled)
            raise Refusal(f"SASL mechanism {mechanism!r} cannot be passed through (UNSUPPORTED_SASL_MECHANISM)", reply)
        self.mechanism, self.principal, self.state = mechanism, None, State.AUTHENTICATING
        self._first_token_seen, self._token_owner = False, None
        self._awaited[correlation_id] = (SASL_HANDSHAKE, version)

    def _start_owner_lookup(self, token_id: str | None, version: int, correlation_id: int) -> None:
        if self._look_up_owner is None or token_id is None:
            message = ("delegation tokens (SCRAM tokenauth=true) are not supported on this listener: the principal, "
                       "the token's owner, cannot be asked of the cluster here")
            raise Refusal(message, _authenticate_reply(version, correlation_id, _SASL_AUTHENTICATION_FAILED, message,
                                                       0))
        self._owner_lookup = asyncio.get_running_loop().create_task(self._owner_of(token_id))

    async def _owner_of(self, token_id: str) -> None:
        try:
            owner = await self._look_up_owner(token_id)  # type: ignore[misc]
        except Exception as exc:  # the cluster did not answer: the exchange fails below, with a log line
            log.warning("event=delegation_token_owner_unknown peer=%s error=%r", self.peer, exc)
            owner = None
        self._token_owner = owner or ""
        self._owner_lookup = None  # no cycle through the finished task
        wake = self._wake() if self._wake is not None else None
        if wake is not None:
            wake()

    def observe(self, correlation_id: int | None, frame: Any) -> bytes | None:
        """A relayed response on its way to the client (size prefix included): the broker's SASL answers move the
        state before the client can send its next request. Returns the frame to send instead, if it changes (the
        session lifetime, or a re-authentication under another principal failed); HOLD: not yet (a delegation
        token's owner is still being looked up; observe it again once woken)."""
        if correlation_id is None:
            return None
        awaited = self._awaited.get(correlation_id)
        if awaited is None:
            return None
        api_key, version = awaited
        answered, body = decode_response(api_key, version, bytes(frame[4:]))
        if (api_key == SASL_AUTHENTICATE and self._owner_lookup is not None and int(body.error_code) == 0
                and self._final(bytes(body.auth_bytes))):
            return HOLD
        del self._awaited[correlation_id]
        if int(body.error_code) != 0:
            log.info("event=sasl_failed peer=%s mechanism=%s principal=%s error_code=%d reauthentication=%s",
                     self.peer, self.mechanism, self.principal, int(body.error_code), self._previous is not None)
            # the broker closes the connection; nothing more is admitted meanwhile
            return self._as_reauthentication_failure(version, answered, body) if api_key == SASL_AUTHENTICATE else None
        if api_key == SASL_AUTHENTICATE and self.state is State.AUTHENTICATING and self._final(bytes(body.auth_bytes)):
            return self._complete(version, answered, body)
        return None

    def _as_reauthentication_failure(self, version: int, correlation_id: int, body: Any) -> bytes | None:
        """On a fresh upstream connection the broker saw a first authentication: its generic message then says so,
        where Kafka's for a re-authentication says "during re-authentication"."""
        if (self._previous is None or not self.reauth_on_fresh_link
                or body.error_message != _GENERIC_FAILURE.format("authentication", self.mechanism)):
            return None
        message = _GENERIC_FAILURE.format("re-authentication", self.mechanism)
        return _authenticate_reply(version, correlation_id, int(body.error_code), message, 0)

    def _complete(self, version: int, correlation_id: int, body: Any) -> bytes | None:
        broker_lifetime_ms = _lifetime_ms(body)
        if self._token_owner is not None:
            if not self._token_owner:
                message = ("the owner of this delegation token could not be described by the coordinator's "
                           "principal (DescribeDelegationToken): it is the connection's principal")
                self.close_reason, self.state, self._failure = message, State.REAUTH_FAILED, message
                self._previous = None
                return _authenticate_reply(version, correlation_id, _SASL_AUTHENTICATION_FAILED, message, 0)
            self.principal = self._token_owner
        previous, self._previous = self._previous, None
        if previous is not None and self.reauth_on_fresh_link:
            self.fresh_link_done = True
        else:
            self.link_lifetime_ms = broker_lifetime_ms  # the exchange ran on the link: its broker session's
        if previous is not None and previous[1] != self.principal:
            message = (f"Cannot change principals during re-authentication from User.{previous[1]}: "
                       f"User.{self.principal}")
            self.close_reason = message
            self.state, self._failure = State.REAUTH_FAILED, message  # nothing more is admitted
            return _authenticate_reply(version, correlation_id, _SASL_AUTHENTICATION_FAILED, message, 0)
        lifetime_ms = _session_lifetime_ms(self.max_reauth_ms.for_mechanism(self.mechanism), broker_lifetime_ms)
        self.expires_at_ms = self._now_ms() + lifetime_ms if lifetime_ms else None
        self.state = State.COMPLETE
        log.info("event=sasl_authenticated peer=%s listener=%s mechanism=%s principal=User:%s session_lifetime_ms=%d%s",
                 self.peer, self.listener, self.mechanism, self.principal, lifetime_ms,
                 " reauthentication=true" if previous is not None else "")
        if version >= 1 and lifetime_ms != broker_lifetime_ms:
            return _authenticate_reply(version, correlation_id, 0, None, lifetime_ms, bytes(body.auth_bytes))
        return None

    def _final(self, server_token: bytes) -> bool:
        if self.mechanism == "PLAIN":
            return True
        if self.mechanism == "OAUTHBEARER":
            return not server_token
        return server_token.startswith(b"v=")  # SCRAM's server-final message


HOLD = b"hold"  # observe(): keep the answer back for now


def _session_lifetime_ms(max_reauth_ms: int, broker_lifetime_ms: int) -> int:
    """SaslServerAuthenticator's rule with the broker's lifetime (itself bounded by the credential's expiry) in
    place of the credential's: the smaller of those set, 0 when neither is."""
    limits = [limit for limit in (max_reauth_ms, broker_lifetime_ms) if limit > 0]
    return min(limits) if limits else 0


def _lifetime_ms(body: Any) -> int:
    lifetime = getattr(body, "session_lifetime", None)  # SaslAuthenticate v0 has none
    return int(lifetime.total_seconds() * 1000) if lifetime else 0


def _handshake_reply(version: int, correlation_id: int, error_code: int, mechanisms: tuple[str, ...]) -> bytes:
    header = RequestHeader(SASL_HANDSHAKE, version, correlation_id, None)
    return encode_response(header, build(apis.response_class(SASL_HANDSHAKE, version),
                                         error_code=error(error_code), mechanisms=mechanisms))


def _authenticate_reply(version: int, correlation_id: int, error_code: int, message: str | None, lifetime_ms: int,
                        auth_bytes: bytes = b"") -> bytes:
    fields: dict[str, Any] = {"error_code": error(error_code), "error_message": message, "auth_bytes": auth_bytes}
    if version >= 1:
        fields["session_lifetime"] = datetime.timedelta(milliseconds=lifetime_ms)
    header = RequestHeader(SASL_AUTHENTICATE, version, correlation_id, None)
    return encode_response(header, build(apis.response_class(SASL_AUTHENTICATE, version), **fields))


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def passed_through_ranges(upstream: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """SaslHandshake (v1 only) and SaslAuthenticate at the broker's versions, advertised on SASL listeners."""
    ranges = {}
    if SASL_HANDSHAKE in upstream and upstream[SASL_HANDSHAKE][1] >= 1:
        ranges[SASL_HANDSHAKE] = (max(1, upstream[SASL_HANDSHAKE][0]), 1)
    if SASL_AUTHENTICATE in upstream:
        ranges[SASL_AUTHENTICATE] = (upstream[SASL_AUTHENTICATE][0], min(2, upstream[SASL_AUTHENTICATE][1]))
    return ranges


def _delegation_token(mechanism: str | None, client_first: bytes) -> bool:
    """A SCRAM client-first message with the `tokenauth=true` extension (a delegation token: the broker takes the
    token's owner as the principal, and its name is not in the message)."""
    if not (mechanism or "").startswith("SCRAM-"):
        return False
    return b",tokenauth=true" in client_first.split(b",r=", 1)[-1].lower()


def _principal(mechanism: str | None, token: bytes, claim: str = "sub") -> str | None:
    try:
        if mechanism == "PLAIN":
            parts = token.split(b"\0")
            return parts[1].decode() if len(parts) == 3 else None
        if mechanism == "OAUTHBEARER":
            return oauthbearer_subject(token, claim)
        if mechanism and mechanism.startswith("SCRAM-"):
            for part in token.decode().split(","):
                if part.startswith("n="):
                    return part[2:].replace("=2C", ",").replace("=3D", "=")
    except UnicodeDecodeError:
        return None
    return None
