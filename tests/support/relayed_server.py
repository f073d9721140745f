"""A real `CoordinatorServer` with its `Relay` in front of the real broker (group state in memory), for tests of
what connections leave behind."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass

from coordinator.config import CoordinatorConfig
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.relay.config import RelayConfig
from coordinator.relay.relay import Relay
from coordinator.server import ServerConfig
from coordinator.server.handlers import served_ranges
from coordinator.server.listener import CoordinatorServer
from coordinator.timer import SystemTimer

# ListOffsets v2 asking for no topics: a request the relay forwards upstream, whatever the cluster holds
LIST_OFFSETS_NO_TOPICS = struct.pack(">hhih", 2, 1, 9, 5) + b"churn" + struct.pack(">ii", -1, 0)


@dataclass
class RelayedServer:
    server: CoordinatorServer
    relay: Relay
    broker_port: int  # our listener standing for the cluster's first broker


@contextlib.asynccontextmanager
async def relayed_server(kafka_bootstrap: str, name: str) -> AsyncIterator[RelayedServer]:
    timer = SystemTimer(name)
    timer.start()
    coordinator = GroupRuntime(CoordinatorConfig(group_initial_rebalance_delay_ms=0), timer, InMemoryGroupStore())
    relay = Relay(RelayConfig(), kafka_bootstrap, served=served_ranges(),
                  max_frame_bytes=ServerConfig().max_frame_bytes)
    server = CoordinatorServer(ServerConfig(listen_port=0, node_id=2_000_000_000, shutdown_grace_ms=1_000),
                               coordinator, relay=relay)
    await server.start()
    try:
        assert relay.listeners is not None
        broker_port = relay.listeners.port_of(min(relay.brokers))
        assert broker_port is not None
        yield RelayedServer(server, relay, broker_port)
    finally:
        await server.close()
        await coordinator.shutdown()
        await timer.close()
