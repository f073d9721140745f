"""Connections the coordinator opens to the cluster itself (the relay's control link and per-client upstream
links; the start-up check): TLS verified against the broker's own advertised host name, then the SASL exchange,
before any other request."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from protocol.client import KafkaClient
from protocol.errors import ConnectionClosed, ProtocolError, RequestTimedOut

from coordinator.security.clusters import ClusterSecurity
from coordinator.security.reauthentication import ReauthenticatingClient
from coordinator.security.sasl_client import ClusterAuthenticationError, authenticate, supports


class ClusterAccessError(Exception):
    """TLS or SASL to the cluster failed: a setting of --command-config (or the cluster's) is wrong. One line."""


async def connect(host: str, port: int, security: ClusterSecurity | None, *, client_id: str, timeout_ms: int,
                  negotiate: bool = True, reauthenticate: bool = False) -> KafkaClient:
    """A client connection to one broker, authenticated as `security` says. TLS and SASL failures raise
    ClusterAccessError; an unreachable broker raises OSError/TimeoutError as a plain connection would.
    `reauthenticate`: a connection kept for long, re-authenticated before the broker's session on it ends
    (KIP-368; reauthentication.py)."""
    context = security.ssl_for(host, port) if security is not None else None
    kind = ReauthenticatingClient if reauthenticate else KafkaClient
    try:
        client = await kind.connect(host, port, client_id=client_id, timeout_ms=timeout_ms, negotiate=False,
                                    ssl=context)
    except ssl.SSLError as exc:
        raise ClusterAccessError(f"TLS to {host}:{port} failed: {_ssl_reason(exc)}") from None
    if security is not None and security.tls_sessions is not None:
        security.tls_sessions.completed(context)
    try:
        if security is not None and security.client.uses_sasl and supports(security.client):
            lifetime_ms = await authenticate(client.request, security.client)
            if isinstance(client, ReauthenticatingClient):
                client.keep_authenticated(security.client, lifetime_ms)
        if negotiate:
            await client.negotiate_versions()
    except ClusterAuthenticationError as exc:
        await client.close()
        who = security.client.username if security is not None else None
        raise ClusterAccessError(f"SASL authentication to {host}:{port} failed (mechanism "
                                 f"{security.client.mechanism if security else '?'}, user {who}): {exc}") from None
    except (ConnectionClosed, RequestTimedOut, ProtocolError) as exc:
        await client.close()
        if context is not None and isinstance(exc, ConnectionClosed):
            raise ClusterAccessError(f"TLS to {host}:{port}: the broker closed the connection ({exc}): a client "
                                     f"certificate it requires, or a listener that is not TLS?") from None
        raise
    except BaseException:
        await client.close()
        raise
    return client


async def open_link(protocol: Any, host: str, port: int, security: ClusterSecurity | None, *, client_id: str,
                    timeout_ms: int) -> None:
    """Connect and authenticate, then give the connection to `protocol` (an asyncio protocol whose
    connection_made has not been called yet)."""
    client = await connect(host, port, security, client_id=client_id, timeout_ms=timeout_ms, negotiate=False)
    transport = client.detach()
    transport.set_protocol(protocol)
    protocol.connection_made(transport)


async def check_cluster_access(bootstrap: str, security: ClusterSecurity, timeout_ms: int = 15_000) -> None:
    """Before any client starts: the first bootstrap broker that answers must accept our TLS and SASL, else
    ClusterAccessError says which setting failed (librdkafka's clients would only retry and log). An address
    that does not answer at all is left to the clients' own retries and messages."""
    for address in (part.strip() for part in bootstrap.split(",") if part.strip()):
        host, _, port = address.rpartition(":")
        try:
            client = await asyncio.wait_for(
                connect(host.strip("[]"), int(port), security, client_id="group-coordinator-check",
                        timeout_ms=timeout_ms), timeout_ms / 1000)
        except (OSError, asyncio.TimeoutError, ConnectionClosed, RequestTimedOut, ProtocolError):
            continue
        await client.close()
        return


def _ssl_reason(exc: ssl.SSLError) -> str:
    reason = getattr(exc, "verify_message", None) or exc.reason or str(exc)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"the broker's certificate was not accepted ({reason}): check ssl.truststore.location / "
                f"ssl.ca.location (the CA that signed the broker's certificate) and that the certificate names "
                f"the broker's advertised host")
    return str(reason)
