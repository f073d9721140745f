"""The relay: clients bootstrap to the coordinator, which serves the group APIs itself and relays every other
request to the real Kafka cluster (docs/relay.md)."""

from coordinator.relay.buffer_pool import BufferExhausted, BufferPool
from coordinator.relay.config import DEFAULT_NODE_ID, RelayConfig
from coordinator.relay.errors import UpstreamUnavailable
from coordinator.relay.relay import Relay

__all__ = ["BufferExhausted", "BufferPool", "DEFAULT_NODE_ID", "Relay", "RelayConfig", "UpstreamUnavailable"]
