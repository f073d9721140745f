"""Relay settings. Memory settings mirror Kafka's producer: buffer.memory, batch.size, max.block.ms."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_NODE_ID = 2_000_000_000  # the coordinator's node id in relay mode: far from any broker's (docs/relay.md)


@dataclass(frozen=True, slots=True)
class RelayConfig:
    # node id -> port: broker listener port = base_port + node id. None: the bootstrap listener's port + 1
    # (with an ephemeral bootstrap port, ephemeral broker ports too: fine for tests, not for restarts).
    base_port: int | None = None
    advertised_host: str | None = None  # host in rewritten addresses; None: the coordinator's advertised host
    buffer_memory_bytes: int = 134_217_728  # all relayed response frames together (Kafka: buffer.memory)
    poolable_bytes: int = 16_384  # frames up to this size reuse pooled buffers (Kafka: batch.size)
    max_block_ms: int = 60_000  # how long a frame may wait for memory before its connection closes
    metadata_refresh_min_interval_ms: int = 100  # refreshes for unknown topics closer than this are shared
    upstream_timeout_ms: int = 30_000  # the relay's own requests (Metadata, FindCoordinator) to the cluster
    # SASL_* listeners: upstream links carry the client's own SASL exchange (TLS only, not our credentials)
    sasl_passthrough: bool = False

    def __post_init__(self) -> None:
        if self.poolable_bytes < 1 or self.buffer_memory_bytes < self.poolable_bytes:
            raise ValueError("relay buffer memory must hold at least one poolable buffer")
        if self.base_port is not None and not 0 <= self.base_port <= 65_535:
            raise ValueError(f"relay base port {self.base_port} is not a port")
        if self.max_block_ms < 0:
            raise ValueError("relay max block ms must not be negative")
