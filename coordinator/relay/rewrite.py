"""Rewriting the answers that carry broker addresses: every upstream broker's host:port becomes the listener
we keep for it, and Metadata gains the coordinators' nodes, ours and every other live instance's (aiokafka finds
its coordinator only in that list; every client then keeps a separate coordinator connection, so a parked
JoinGroup never holds a fetch)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from coordinator.relay.listeners import UpstreamBroker
from protocol.messages import build, item_class

AddressOf = Callable[[int], "tuple[str, int] | None"]


def upstream_brokers(metadata: Any) -> dict[int, UpstreamBroker]:
    # Metadata v0 brokers carry no rack (v1+): a client's v0 request must not fail the relay
    return {int(b.node_id): UpstreamBroker(int(b.node_id), b.host, int(b.port), getattr(b, "rack", None))
            for b in metadata.brokers}


def rewrite_metadata(response: Any, coordinator_nodes: Sequence[Any], address_of: AddressOf) -> Any:
    brokers = []
    for broker in response.brokers:
        address = address_of(int(broker.node_id))
        if address is None:
            continue  # no listener for it (port out of range, bind failed: logged): clients must not see it
        brokers.append(dataclasses.replace(broker, host=address[0], port=address[1]))
    response_class: type = type(response)
    broker_class = item_class(response_class, "brokers")
    brokers.extend(build(broker_class, node_id=node.node_id, host=node.host, port=node.port, rack=None)
                   for node in coordinator_nodes)
    return dataclasses.replace(response, brokers=tuple(brokers))


def rewrite_find_coordinator(response: Any, address_of: AddressOf) -> Any:
    """v0-3 carry one coordinator at the top level, v4+ one per key."""
    if hasattr(response, "coordinators"):
        return dataclasses.replace(
            response, coordinators=tuple(_rewrite_located(entry, address_of) for entry in response.coordinators))
    return _rewrite_located(response, address_of)


def _rewrite_located(entry: Any, address_of: AddressOf) -> Any:
    if int(entry.error_code) != 0 or int(entry.node_id) < 0:
        return entry
    address = address_of(int(entry.node_id))
    if address is None:  # a broker we cannot reach clients to: as if the coordinator were unavailable
        return dataclasses.replace(entry, error_code=type(entry.error_code)(15), node_id=-1, host="", port=-1)
    return dataclasses.replace(entry, host=address[0], port=address[1])
