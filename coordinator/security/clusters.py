"""Which security each Kafka cluster this process talks to takes, by its bootstrap address.

Set once at start (`use_for_cluster`), read wherever a client of that cluster is made: `secured(settings)` adds
the librdkafka settings to a confluent-kafka client's, `cluster_security(bootstrap)` gives the relay what its own
connections need. A client made for a cluster nobody secured gets its settings unchanged (PLAINTEXT)."""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from coordinator.security.client_config import ClientSecurity
from coordinator.security.tls_sessions import TlsSessions

_Settings = TypeVar("_Settings", bound=dict[str, Any])


@dataclass(frozen=True)
class ClusterSecurity:
    """A cluster's client security with its TLS context built once (reading the PEM files once), and the TLS
    sessions our own connections to its brokers resume (None: a full handshake every time)."""

    client: ClientSecurity
    ssl_context: ssl.SSLContext | None
    librdkafka: dict[str, str]
    tls_sessions: TlsSessions | None = field(default_factory=TlsSessions, compare=False)

    def ssl_for(self, host: str, port: int) -> ssl.SSLContext | None:
        """The TLS context of one connection to host:port (None: plaintext)."""
        if self.ssl_context is None or self.tls_sessions is None:
            return self.ssl_context
        return self.tls_sessions.context_for(self.ssl_context, host, port)

    @classmethod
    def of(cls, client: ClientSecurity) -> ClusterSecurity:
        return cls(client, client.ssl_context(), client.librdkafka_settings())


_CLUSTERS: dict[str, ClusterSecurity] = {}


def use_for_cluster(bootstrap: str, security: ClientSecurity) -> Callable[[], None]:
    """Every client of `bootstrap` made from now on uses `security`; call the returned function to forget it."""
    entry = ClusterSecurity.of(security)
    _CLUSTERS[bootstrap] = entry

    def forget() -> None:
        if _CLUSTERS.get(bootstrap) is entry:
            del _CLUSTERS[bootstrap]

    return forget


def cluster_security(bootstrap: str) -> ClusterSecurity | None:
    return _CLUSTERS.get(bootstrap)


def without_sasl(security: ClusterSecurity | None) -> ClusterSecurity | None:
    """The same cluster reached with TLS only (a connection whose client runs its own SASL exchange)."""
    if security is None or not security.client.uses_sasl:
        return security
    client = dataclasses.replace(security.client, protocol="SSL" if security.client.uses_tls else "PLAINTEXT",
                                 mechanism=None, username=None, password=None, oauthbearer=None)
    return ClusterSecurity(client, security.ssl_context, client.librdkafka_settings(), security.tls_sessions)


def secured(settings: _Settings) -> _Settings:
    """A confluent-kafka client's settings with the security of the cluster in their bootstrap.servers."""
    entry = _CLUSTERS.get(str(settings.get("bootstrap.servers", "")))
    if entry is not None:
        settings.update(entry.librdkafka)
    return settings
