"""A client connection's relay side (coordinator/server/relaying.py) when no upstream broker can be had: the
connection is to be closed as an outage of the cluster, with the relay's reason, not treated as our bug."""

from __future__ import annotations

import struct

from coordinator.relay import Relay, RelayConfig
from coordinator.server.config import ServerConfig
from coordinator.server.handlers import served_ranges
from coordinator.server.relaying import RelaySide

_PRODUCE_V9_HEADER = struct.pack(">hhih", 0, 9, 41, -1) + b"\x00"  # Produce v9, correlation id 41, no client id


class Owner:
    """The link owner a RelaySide hands to the relay (a client connection in the service)."""

    peer = "127.0.0.1:1"

    def relay_responses_ready(self) -> None:
        raise AssertionError("no link, no responses")

    def relay_blocked_changed(self) -> None:
        raise AssertionError("no link, no blocking")

    def relay_failed(self, reason: str, detail: str) -> None:
        raise AssertionError("no link to fail")


def relay_knowing_no_broker() -> Relay:
    return Relay(RelayConfig(), "127.0.0.1:9", served=served_ranges(), max_frame_bytes=ServerConfig().max_frame_bytes)


def test_a_request_with_no_broker_to_relay_to_asks_for_the_connection_to_close_as_an_outage() -> None:
    side = RelaySide(relay_knowing_no_broker(), upstream_node=None)
    assert side.forward(_PRODUCE_V9_HEADER, 0, Owner()) == ("upstream_unavailable", "no upstream broker known")
    assert side.link is None and not side.pending and not side.blocked()


def test_a_broker_listener_whose_broker_left_the_metadata_asks_the_same() -> None:
    side = RelaySide(relay_knowing_no_broker(), upstream_node=7)
    assert side.forward(_PRODUCE_V9_HEADER, 0, Owner()) == (
        "upstream_unavailable", "broker 7 is not in the cluster's metadata")
