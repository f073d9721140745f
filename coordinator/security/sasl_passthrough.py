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

After completion the connection serves everything (group APIs here, the rest relayed); a new SaslHandshake
(KIP-368 re-authentication) is passed through too. The principal, for the log, is the name in the client's own
first message (PLAIN's authcid, SCRAM's `n=`, OAUTHBEARER's token's `sub` claim), never its password; it is
the connection's principal for authorization once the broker accepted the exchange.
"""

from __future__ import annotations

import enum
import logging
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
PASSABLE_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


class State(enum.Enum):
    INITIAL = "initial"  # nothing but ApiVersions and SaslHandshake
    AUTHENTICATING = "authenticating"  # a handshake passed: SaslAuthenticate until the broker's final answer
    COMPLETE = "complete"


class Refusal(Exception):
    """The client broke Kafka's SASL sequence: close its connection (after `reply`, if any)."""

    def __init__(self, reason: str, reply: bytes | None = None) -> None:
        super().__init__(reason)
        self.reply = reply


class SaslPassthrough:
    __slots__ = ("state", "mechanism", "principal", "_awaited", "peer", "enabled", "claim")

    def __init__(self, peer: str = "?", enabled: tuple[str, ...] = PASSABLE_MECHANISMS, claim: str = "sub") -> None:
        self.enabled = enabled  # sasl.enabled.mechanisms of our listener
        self.claim = claim  # sasl.oauthbearer.sub.claim.name: the OAUTHBEARER token's claim naming the principal
        self.state = State.INITIAL
        self.mechanism: str | None = None
        self.principal: str | None = None
        self._awaited: dict[int, tuple[int, int]] = {}  # correlation id -> (api key, version) of SASL requests
        self.peer = peer

    @property
    def awaiting(self) -> bool:
        return bool(self._awaited)

    def admit(self, frame: bytes) -> None:
        """A request of this connection (size prefix removed), before it is handled or relayed: Refusal if
        Kafka's sequence forbids it here."""
        api_key, version, correlation_id = peek_header(frame)
        if api_key == _API_VERSIONS:
            return
        if api_key == SASL_HANDSHAKE:
            self._handshake(frame, version, correlation_id)
            return
        if api_key == SASL_AUTHENTICATE:
            if self.state is State.INITIAL:
                raise Refusal("SaslAuthenticate before SaslHandshake (ILLEGAL_SASL_STATE)")
            if self.principal is None and self.state is State.AUTHENTICATING:
                self.principal = _principal(self.mechanism, decode_request(frame).body.auth_bytes, self.claim)
            self._awaited[correlation_id] = (api_key, version)
            return
        if self.state is not State.COMPLETE:
            raise Refusal(f"api_key={api_key} before SASL authentication completed (state {self.state.value})")

    def _handshake(self, frame: bytes, version: int, correlation_id: int) -> None:
        if version == 0:
            raise Refusal("SaslHandshake v0 (tokens outside Kafka's framing) is not supported: use a client that "
                          "sends SaslAuthenticate (Kafka 1.0+)")
        mechanism = decode_request(frame).body.mechanism
        if mechanism not in self.enabled:
            header = RequestHeader(SASL_HANDSHAKE, version, correlation_id, None)
            reply = encode_response(header, build(apis.response_class(SASL_HANDSHAKE, version),
                                                  error_code=error(_UNSUPPORTED_SASL_MECHANISM),
                                                  mechanisms=self.enabled))
            raise Refusal(f"SASL mechanism {mechanism!r} cannot be passed through (UNSUPPORTED_SASL_MECHANISM)", reply)
        self.mechanism, self.principal, self.state = mechanism, None, State.AUTHENTICATING
        self._awaited[correlation_id] = (SASL_HANDSHAKE, version)

    def observe(self, correlation_id: int | None, frame: Any) -> None:
        """A relayed response on its way to the client (size prefix included): the broker's SASL answers move the
        state before the client can send its next request."""
        awaited = self._awaited.pop(correlation_id, None) if correlation_id is not None else None
        if awaited is None:
            return
        api_key, version = awaited
        _correlation, body = decode_response(api_key, version, bytes(frame[4:]))
        if int(body.error_code) != 0:
            log.info("event=sasl_failed peer=%s mechanism=%s principal=%s error_code=%d", self.peer,
                     self.mechanism, self.principal, int(body.error_code))
            return  # the broker closes the connection; nothing more is admitted meanwhile
        if api_key == SASL_AUTHENTICATE and self.state is State.AUTHENTICATING and self._final(bytes(body.auth_bytes)):
            self.state = State.COMPLETE
            log.info("event=sasl_authenticated peer=%s mechanism=%s principal=User:%s", self.peer, self.mechanism,
                     self.principal)

    def _final(self, server_token: bytes) -> bool:
        if self.mechanism == "PLAIN":
            return True
        if self.mechanism == "OAUTHBEARER":
            return not server_token
        return server_token.startswith(b"v=")  # SCRAM's server-final message


def passed_through_ranges(upstream: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """SaslHandshake (v1 only) and SaslAuthenticate at the broker's versions, advertised on SASL listeners."""
    ranges = {}
    if SASL_HANDSHAKE in upstream and upstream[SASL_HANDSHAKE][1] >= 1:
        ranges[SASL_HANDSHAKE] = (max(1, upstream[SASL_HANDSHAKE][0]), 1)
    if SASL_AUTHENTICATE in upstream:
        ranges[SASL_AUTHENTICATE] = (upstream[SASL_AUTHENTICATE][0], min(2, upstream[SASL_AUTHENTICATE][1]))
    return ranges


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
