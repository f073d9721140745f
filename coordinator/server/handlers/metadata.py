"""Metadata (3). With the relay: the cluster's answer, its brokers' addresses rewritten to our per-broker
listeners and this coordinator's node added (coordinator/relay). Without it (--no-relay): this coordinator is the
only broker and the controller and knows no topics: a request for all topics gets none, named topics get
UNKNOWN_TOPIC_OR_PARTITION, as a broker without auto-creation answers for topics it does not have."""

from __future__ import annotations

from typing import Any

from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY = ApiKey.METADATA
VERSIONS = (0, 12)
_AUTHORIZED_OPERATIONS_OMITTED = -2147483648


def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    if ctx.relay is not None:
        return ctx.relay.metadata(body, ctx.node)  # a coroutine: the connection awaits it
    cls = response_class(API_KEY, header.api_version)
    node = ctx.node
    broker = build(item_class(cls, "brokers"), node_id=node.node_id, host=node.host, port=node.port, rack=None)
    topic_class = item_class(cls, "topics")
    topics = tuple(_unknown_topic(topic_class, requested.name) for requested in body.topics or ())
    return build(
        cls,
        throttle_time=ZERO_DURATION,
        brokers=(broker,),
        cluster_id=node.cluster_id,
        controller_id=node.node_id,
        topics=topics,
        cluster_authorized_operations=_AUTHORIZED_OPERATIONS_OMITTED,
    )


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
