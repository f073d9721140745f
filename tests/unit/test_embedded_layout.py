"""The embedded Kafka's data dir keeps its address and its shape (no JVM is started here)."""

from __future__ import annotations

import json
import socket
import struct

import pytest

from coordinator.embedded import BrokerStartError, EmbeddedKafka, EmbeddedKafkaCluster
from coordinator.embedded.broker import _broker_ids, port_is_free
from tests.support.ports import free_port


def test_stored_ports_are_the_nodes_address(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "ports.json").write_text(json.dumps({"node_id": 1, "port": 41001, "controller_port": 41002}))
    broker = EmbeddedKafka(tmp_path)
    assert (broker.port, broker.controller_port, broker.bootstrap) == (41001, 41002, "127.0.0.1:41001")


def test_an_unreadable_ports_file_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "ports.json").write_text("{not json")
    with pytest.raises(BrokerStartError, match="ports.json"):
        EmbeddedKafka(tmp_path)


def test_port_is_free_sees_a_listener_only() -> None:
    listener = socket.socket()
    port = free_port()  # below the ephemeral range: no one else's once closed
    listener.bind(("127.0.0.1", port))
    listener.listen()
    assert not port_is_free(port)
    listener.close()
    assert port_is_free(port)


def test_cluster_nodes_share_one_quorum_and_keep_their_ports(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cluster = EmbeddedKafkaCluster(3, tmp_path / "c")
    quorum = {node.controller_quorum for node in cluster.nodes.values()}
    assert len(quorum) == 1 and quorum.pop().count("@127.0.0.1:") == 3
    assert {node.cluster_id for node in cluster.nodes.values()} == {cluster.cluster_id}
    for node in cluster.nodes.values():  # what a first start stores
        node.data_dir.mkdir(parents=True)
        node._claim_ports()
    again = EmbeddedKafkaCluster(3, tmp_path / "c")
    assert again.addresses() == cluster.addresses() and again.cluster_id == cluster.cluster_id
    assert len(set(cluster.addresses().values())) == 3
    assert cluster.bootstrap == ",".join(cluster.addresses().values())


def test_a_data_dir_is_one_shape_of_cluster(tmp_path) -> None:  # type: ignore[no-untyped-def]
    EmbeddedKafkaCluster(3, tmp_path / "c")
    with pytest.raises(BrokerStartError, match="3-broker cluster, not 2"):
        EmbeddedKafkaCluster(2, tmp_path / "c")
    with pytest.raises(BrokerStartError, match="multi-broker"):
        EmbeddedKafka(tmp_path / "c")
    (tmp_path / "single" / "logs").mkdir(parents=True)
    (tmp_path / "single" / "logs" / "meta.properties").write_text("node.id=1\n")
    with pytest.raises(BrokerStartError, match="single broker"):
        EmbeddedKafkaCluster(3, tmp_path / "single")


def test_metadata_v0_broker_ids_are_parsed() -> None:
    def broker(node_id: int, host: bytes, port: int) -> bytes:
        return struct.pack(">ih", node_id, len(host)) + host + struct.pack(">i", port)

    response = struct.pack(">ii", 7, 3) + broker(1, b"127.0.0.1", 9092) + broker(2, b"h", 1) + broker(30, b"", 2)
    assert _broker_ids(response + struct.pack(">i", 0)) == {1, 2, 30}
