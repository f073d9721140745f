"""OffsetDelete (47), v0. A group-level error answers with no topics (OffsetDeleteRequest.getErrorResponse)."""

from __future__ import annotations

from typing import Any

from coordinator.group import api
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY = ApiKey.OFFSET_DELETE
VERSIONS = (0, 0)


def to_request(header: RequestHeader, body: Any) -> api.OffsetDeleteRequest:
    topics = [api.OffsetDeleteRequestTopic(t.name, [p.partition_index for p in t.partitions]) for t in body.topics]
    return api.OffsetDeleteRequest(body.group_id, topics, header.api_version)


def to_response(version: int, response: api.OffsetDeleteResponse) -> Any:
    cls = response_class(API_KEY, version)
    topic_class = item_class(cls, "topics")
    partition_class = item_class(topic_class, "partitions")
    topics = tuple(
        topic_class(name=t.name, partitions=tuple(
            partition_class(partition_index=p.partition_index, error_code=error(p.error_code)) for p in t.partitions))
        for t in response.topics
    )
    return build(cls, error_code=error(response.error_code), throttle_time=ZERO_DURATION, topics=topics)


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    response = await ctx.coordinator.delete_offsets(to_request(header, body))
    return to_response(header.api_version, response)
