"""Who sent the request being handled: the connection's authenticated principal and its listener's security
protocol, for telemetry (request spans, rebalance member spans, member events).

The connection sets it in the context its handlers run in (coordinator/server/connection.py), so whatever a
handler calls sees the sender's identity without it being passed along: the group logic stays unaware of it, and
classic and consumer-protocol paths alike get it. Outside a request (timers, loading) there is none.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

PRINCIPAL = "coordinator.client.principal"  # as Kafka names it: "User:alice"
SECURITY_PROTOCOL = "coordinator.client.security_protocol"  # the listener's: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    principal: str
    security_protocol: str

    def attributes(self) -> dict[str, Any]:
        return {PRINCIPAL: self.principal, SECURITY_PROTOCOL: self.security_protocol}


def security_protocol(tls: bool, sasl: bool) -> str:
    return ("SASL_" if sasl else "") + ("SSL" if tls else "PLAINTEXT")


_CURRENT: contextvars.ContextVar[ClientIdentity | None] = contextvars.ContextVar("client_identity", default=None)


def current_identity() -> ClientIdentity | None:
    return _CURRENT.get()


def identity_attributes() -> dict[str, Any]:
    """The sender's principal and security protocol as span or event attributes ({} outside a request)."""
    identity = _CURRENT.get()
    return {} if identity is None else identity.attributes()


def context_with(identity: ClientIdentity) -> contextvars.Context:
    """A context for a connection's requests: the current one, with `identity` as the sender."""
    context = contextvars.copy_context()
    context.run(_CURRENT.set, identity)
    return context
