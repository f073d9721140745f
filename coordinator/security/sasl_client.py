"""The client side of Kafka's SASL exchange, for the connections the coordinator opens itself (the relay's):
SaslHandshake v1 naming the mechanism, then SaslAuthenticate requests carrying the mechanism's tokens (KIP-152).

Mechanisms: PLAIN (RFC 4616), SCRAM-SHA-256/512 (RFC 5802/7677, the server's signature checked), OAUTHBEARER
with an unsecured token (RFC 7628 framing; Kafka's unsecured validator). OAUTHBEARER through an OIDC token
endpoint is left to librdkafka's clients: `supports()` says so.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from protocol import apis
from protocol.messages import build

from coordinator.security.client_config import ClientSecurity

Request = Callable[[Any], Awaitable[Any]]
_SASL_AUTHENTICATION_FAILED = 58
_UNSUPPORTED_SASL_MECHANISM = 33
_ILLEGAL_SASL_STATE = 34
_SASL_HANDSHAKE = 17  # api keys
_SASL_AUTHENTICATE = 36
_HANDSHAKE_VERSION = 1
_AUTHENTICATE_VERSION = 2
_UNSECURED_TOKEN_LIFETIME_S = 3600


class ClusterAuthenticationError(Exception):
    """The cluster refused our credentials (or our mechanism); the message is the broker's."""


def supports(security: ClientSecurity) -> bool:
    """True when this module can authenticate with `security` (else only librdkafka can)."""
    return not (security.mechanism == "OAUTHBEARER" and security.oauthbearer is not None
                and not security.oauthbearer.unsecured)


async def authenticate(request: Request, security: ClientSecurity) -> int:
    """Run the exchange over `request` (one connection's request/response); the session lifetime the broker
    gives (ms, 0: none). Raises ClusterAuthenticationError when the broker says no."""
    assert security.mechanism is not None
    return await run_exchange(request, security.mechanism, _exchange(security))


async def run_exchange(request: Request, mechanism: str, exchange: Generator[bytes, bytes, None]) -> int:
    """SaslHandshake naming `mechanism`, then SaslAuthenticate carrying the tokens of `exchange` (a generator as
    `_exchange` makes) until it ends; the session lifetime given (ms, 0: none)."""
    handshake = await request(build(apis.request_class(_SASL_HANDSHAKE, _HANDSHAKE_VERSION), mechanism=mechanism))
    code = int(handshake.error_code)
    if code == _UNSUPPORTED_SASL_MECHANISM:
        raise ClusterAuthenticationError(f"the broker does not enable SASL mechanism {mechanism} "
                                         f"(it enables {', '.join(handshake.mechanisms) or 'none'})")
    if code != 0:
        raise ClusterAuthenticationError(f"SaslHandshake failed with error code {code}")
    token = next(exchange)
    authenticate_class = apis.request_class(_SASL_AUTHENTICATE, _AUTHENTICATE_VERSION)
    while True:
        response = await request(build(authenticate_class, auth_bytes=token))
        code = int(response.error_code)
        if code != 0:
            detail = response.error_message or f"error code {code}"
            raise ClusterAuthenticationError(detail if code == _SASL_AUTHENTICATION_FAILED
                                             else f"SaslAuthenticate failed ({code}): {detail}")
        try:
            token = exchange.send(bytes(response.auth_bytes))
        except StopIteration:
            return int(response.session_lifetime.total_seconds() * 1000)


def _exchange(security: ClientSecurity) -> Generator[bytes, bytes, None]:
    """A generator of our tokens: sent each server token, yields the next of ours; returns when done."""
    if security.mechanism == "PLAIN":
        return _plain(security.username or "", security.password or "")
    if security.mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        return _scram(security.mechanism, security.username or "", security.password or "")
    if security.mechanism == "OAUTHBEARER" and supports(security):
        return _unsecured_oauthbearer((security.oauthbearer and security.oauthbearer.principal) or "")
    raise ClusterAuthenticationError(f"SASL mechanism {security.mechanism} is not supported by the relay's own "
                                     f"connections")


def _plain(username: str, password: str) -> Generator[bytes, bytes, None]:
    yield b"\0" + username.encode() + b"\0" + password.encode()


def _scram(mechanism: str, username: str, password: str, client_nonce: str | None = None, *,
           token: bool = False) -> Generator[bytes, bytes, None]:
    """`token`: a delegation token (username: its id; password: its HMAC, base64), Kafka's `tokenauth` extension."""
    digest = hashlib.sha256 if mechanism == "SCRAM-SHA-256" else hashlib.sha512
    client_nonce = client_nonce or base64.b64encode(secrets.token_bytes(24)).decode()
    saslname = username.replace("=", "=3D").replace(",", "=2C")
    first_bare = f"n={saslname},r={client_nonce}" + (",tokenauth=true" if token else "")
    server_first = (yield f"n,,{first_bare}".encode()).decode()
    fields = _scram_fields(server_first)
    nonce, salt, iterations = fields.get("r", ""), fields.get("s", ""), fields.get("i", "")
    if not nonce.startswith(client_nonce) or not salt or not iterations.isdigit():
        raise ClusterAuthenticationError("the broker's SCRAM server-first message is malformed")
    salted = hashlib.pbkdf2_hmac(digest().name, password.encode(), base64.b64decode(salt), int(iterations))
    client_key = hmac.digest(salted, b"Client Key", digest)
    stored_key = digest(client_key).digest()
    final_without_proof = f"c=biws,r={nonce}"
    auth_message = f"{first_bare},{server_first},{final_without_proof}".encode()
    signature = hmac.digest(stored_key, auth_message, digest)
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    server_final = (yield f"{final_without_proof},p={base64.b64encode(proof).decode()}".encode()).decode()
    final = _scram_fields(server_final)
    if "e" in final:
        raise ClusterAuthenticationError(f"SCRAM: {final['e']}")
    server_key = hmac.digest(salted, b"Server Key", digest)
    expected = base64.b64encode(hmac.digest(server_key, auth_message, digest)).decode()
    if not hmac.compare_digest(final.get("v", ""), expected):
        raise ClusterAuthenticationError("the broker's SCRAM signature does not match: not the server we trust")


def _scram_fields(message: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in message.split(",") if "=" in part)


def _unsecured_oauthbearer(principal: str) -> Generator[bytes, bytes, None]:
    now = int(time.time())

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).decode().rstrip("=")

    token = f"{part({'alg': 'none'})}.{part({'sub': principal, 'iat': now, 'exp': now + _UNSECURED_TOKEN_LIFETIME_S})}."
    challenge = yield f"n,,\x01auth=Bearer {token}\x01\x01".encode()
    if challenge:  # a JSON error: RFC 7628 has the client answer with a lone 0x01, then the server fails
        yield b"\x01"
