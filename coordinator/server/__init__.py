"""The Kafka-protocol server in front of the GroupRuntime."""

from coordinator.server.config import ServerConfig
from coordinator.server.listener import CoordinatorServer, serve

__all__ = ["CoordinatorServer", "ServerConfig", "serve"]
