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


class MemberIdentities:
    """Each group member's identity attributes, taken on its own request (a tracer's spans for a member may begin
    on another member's request): group id -> member id -> attributes."""

    __slots__ = ("_groups",)

    def __init__(self) -> None:
        self._groups: dict[str, dict[str, dict[str, Any]]] = {}

    def remember(self, group_id: str, member_id: str) -> dict[str, Any]:
        """Call on the member's own request; the attributes remembered ({} outside a request)."""
        attributes = identity_attributes()
        if attributes:
            self._groups.setdefault(group_id, {})[member_id] = attributes
        return attributes

    def of(self, group_id: str, member_id: str) -> dict[str, Any]:
        return self._groups.get(group_id, {}).get(member_id, {})

    def forget(self, group_id: str, member_id: str) -> None:
        members = self._groups.get(group_id)
        if members is not None:
            members.pop(member_id, None)
            if not members:
                del self._groups[group_id]

    def forget_group(self, group_id: str) -> None:
        self._groups.pop(group_id, None)
