"""The cluster goes away under the relay: a request the coordinator answers from the cluster (Metadata) closes
the client's connection as an outage (`reason=upstream_unavailable`, a WARNING), not as a handler bug (ERROR
`event=handler_failed` with a traceback). Clients reconnect and bootstrap again, as after a broker failure."""

from __future__ import annotations

import logging

import pytest
from kio.schema.metadata.v12.request import MetadataRequest

from coordinator.config import CoordinatorConfig
from coordinator.embedded import EmbeddedKafka
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.relay import Relay, RelayConfig
from coordinator.server import ServerConfig
from coordinator.server.handlers import served_ranges
from coordinator.server.listener import CoordinatorServer
from coordinator.timer import SystemTimer
from protocol.client import KafkaClient
from protocol.errors import ConnectionClosed

pytestmark = pytest.mark.integration


async def test_metadata_while_the_cluster_is_down_closes_the_connection_as_an_outage(
    restartable_kafka: EmbeddedKafka, caplog: pytest.LogCaptureFixture,
) -> None:
    timer = SystemTimer("upstream-unavailable")
    timer.start()
    coordinator = GroupRuntime(CoordinatorConfig(group_initial_rebalance_delay_ms=0), timer, InMemoryGroupStore())
    relay = Relay(RelayConfig(upstream_timeout_ms=5_000), restartable_kafka.bootstrap, served=served_ranges(),
                  max_frame_bytes=ServerConfig().max_frame_bytes)
    server = CoordinatorServer(ServerConfig(listen_port=0, node_id=2_000_000_000, shutdown_grace_ms=1_000),
                               coordinator, relay=relay)
    await server.start()
    try:
        client = await KafkaClient.connect("127.0.0.1", server.port, timeout_ms=10_000)
        request = MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                  include_topic_authorized_operations=False)
        answered = await client.request(request, timeout_ms=10_000)
        assert [b.node_id for b in answered.brokers if b.node_id != 2_000_000_000]  # the cluster, rewritten

        await restartable_kafka.stop()
        with caplog.at_level(logging.WARNING, logger="coordinator.server"):
            with pytest.raises(ConnectionClosed):
                await client.request(request, timeout_ms=30_000)
        closes = [r for r in caplog.records if "event=connection_closed" in r.getMessage()]
        assert any("reason=upstream_unavailable" in r.getMessage() and "api_key=3" in r.getMessage()
                   and r.levelname == "WARNING" for r in closes), [r.getMessage() for r in closes]
        assert not [r for r in caplog.records if "event=handler_failed" in r.getMessage()]
    finally:
        await server.close()
        await coordinator.shutdown()
        await timer.close()
