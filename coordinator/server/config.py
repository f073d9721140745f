"""Listener settings, with Kafka's broker defaults where Kafka has one."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.framing import DEFAULT_MAX_FRAME_BYTES

if TYPE_CHECKING:
    from coordinator.security.access import AccessSettings


_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    listen_host: str = "127.0.0.1"
    listen_port: int = 9092  # 0 = any free port (tests)
    advertised_host: str | None = None  # what Metadata/FindCoordinator tell clients; defaults to the listen address
    advertised_port: int | None = None
    node_id: int = 0
    cluster_id: str = "kafka-group-coordinator"
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES  # socket.request.max.bytes
    max_connections: int = 2_147_483_647  # max.connections
    idle_timeout_ms: int = 600_000  # connections.max.idle.ms
    max_buffered_bytes: int = 1_048_576  # bytes read ahead of processing per connection before we stop reading
    shutdown_grace_ms: int = 5_000  # how long in-flight requests may finish at shutdown
    # socket.listen.backlog.size: connections the kernel queues before we accept them. Large enough for a whole
    # cluster of consumers reconnecting at once (a restart, a deploy); the kernel caps it at
    # net.core.somaxconn (docs/operations.md). Kafka's default (50) and asyncio's (100) overflow at once.
    listen_backlog: int = 65_535
    # TLS on our listeners, the coordinator's and the relay's per-broker ones (coordinator/security/listeners.py);
    # None: PLAINTEXT
    ssl_context: ssl.SSLContext | None = None
    # SASL_* listeners: each connection's SASL exchange passes through to the cluster, which decides
    # (coordinator/security/sasl_passthrough.py); nothing but ApiVersions and SASL is served before it succeeded
    sasl_passthrough: bool = False
    # principals on our listeners (ssl.principal.mapping.rules, sasl.enabled.mechanisms) and the authorizer's
    # settings (coordinator/security/access.py); None: Kafka's defaults
    access: AccessSettings | None = None

    def __post_init__(self) -> None:
        if self.max_frame_bytes < 8:
            raise ValueError("max_frame_bytes must hold at least a request header")
        if self.max_connections < 1 or self.max_buffered_bytes < 1:
            raise ValueError("max_connections and max_buffered_bytes must be positive")
        if self.listen_backlog < 1:
            raise ValueError("listen_backlog must be positive")
        if self.idle_timeout_ms < 1:
            raise ValueError("idle_timeout_ms must be positive")
        if self.advertised_host is None and self.listen_host in _WILDCARD_HOSTS:
            # Kafka refuses this too: clients cannot connect to a meta-address
            raise ValueError(f"listening on {self.listen_host!r} needs an advertised host clients can reach")
