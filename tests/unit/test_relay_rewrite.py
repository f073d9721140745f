"""Metadata rewriting at every version the relay advertises: v0 brokers carry no rack (found by the relay
fuzzer: a client's Metadata v0 request failed the handler with AttributeError)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from coordinator.relay.listeners import UpstreamBroker
from coordinator.relay.rewrite import rewrite_metadata, upstream_brokers
from protocol import apis
from protocol.apis import ApiKey
from protocol.messages import build, item_class


def _response(version: int) -> object:
    cls = apis.response_class(ApiKey.METADATA, version)
    broker = build(item_class(cls, "brokers"), node_id=1, host="kafka-1", port=9092, rack="r1")
    return build(cls, throttle_time=None, brokers=(broker,), cluster_id="c", controller_id=1, topics=(),
                 cluster_authorized_operations=-2147483648)


@pytest.mark.parametrize("version", [0, 1, 12])
def test_brokers_are_read_and_rewritten_at_every_metadata_version(version: int) -> None:
    response = _response(version)
    rack = None if version == 0 else "r1"
    assert upstream_brokers(response) == {1: UpstreamBroker(1, "kafka-1", 9092, rack)}
    node = SimpleNamespace(node_id=2_000_000_000, host="127.0.0.1", port=19092)
    rewritten = rewrite_metadata(response, [node], lambda node_id: ("127.0.0.1", 19093))
    assert [(b.node_id, b.host, b.port) for b in rewritten.brokers] == [(1, "127.0.0.1", 19093),
                                                                      (2_000_000_000, "127.0.0.1", 19092)]


def test_metadata_lists_every_coordinator_instance_after_the_upstream_brokers() -> None:
    instances = [SimpleNamespace(node_id=2_000_000_007, host="127.0.0.1", port=19092),
                 SimpleNamespace(node_id=2_000_000_009, host="127.0.0.2", port=29092)]
    rewritten = rewrite_metadata(_response(12), instances, lambda node_id: ("127.0.0.1", 19093))
    assert [(b.node_id, b.host, b.port, b.rack) for b in rewritten.brokers] == [
        (1, "127.0.0.1", 19093, "r1"), (2_000_000_007, "127.0.0.1", 19092, None),
        (2_000_000_009, "127.0.0.2", 29092, None)]
