"""Metadata (3). With the relay: the cluster's answer, its brokers' addresses rewritten to our per-broker
listeners and the coordinators' nodes added (coordinator/relay). Without it (--no-relay): the coordinators are
the only brokers, this one the controller, and they know no topics: a request for all topics gets none, named
topics get UNKNOWN_TOPIC_OR_PARTITION, as a broker without auto-creation answers for topics it does not have.
The coordinators: this node alone, or with several instances every live one (aiokafka connects to the node
FindCoordinator names only if Metadata lists it)."""

from __future__ import annotations

from typing import Any

from coordinator.server.context import ConnectionContext, Node
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY = ApiKey.METADATA
VERSIONS = (0, 12)
_AUTHORIZED_OPERATIONS_OMITTED = -2147483648


def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    nodes = coordinator_nodes(ctx)
    if ctx.relay is not None:
        return ctx.relay.metadata(body, nodes)  # a coroutine: the connection awaits it
    cls = response_class(API_KEY, header.api_version)
    node = ctx.node
    broker_class = item_class(cls, "brokers")
    brokers = tuple(build(broker_class, node_id=n.node_id, host=n.host, port=n.port, rack=None) for n in nodes)
    topic_class = item_class(cls, "topics")
    topics = tuple(_unknown_topic(topic_class, requested.name) for requested in body.topics or ())
    return build(
        cls,
        throttle_time=ZERO_DURATION,
        brokers=brokers,
        cluster_id=node.cluster_id,
        controller_id=node.node_id,
        topics=topics,
        cluster_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED,
    )


def coordinator_nodes(ctx: ConnectionContext) -> list[Node]:
    """This node first, then every other live instance (each node id once: ours wins a clash)."""
    if ctx.directory is None:
        return [ctx.node]
    nodes = [ctx.node]
    seen = {ctx.node.node_id}
    for node in ctx.directory.nodes():
        if node.node_id not in seen:
            seen.add(node.node_id)
            nodes.append(node)
    return nodes


def _unknown_topic(topic_class: type, name: str | None) -> Any:
    return build(
        topic_class,
        error_code=error(Errors.UNKNOWN_TOPIC_OR_PARTITION),
        name=name if name is not None else "",
        topic_id=None,
        is_internal=False,
        partitions=(),
        topic_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED,
    )
