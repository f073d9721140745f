"""OffsetDelete (47), v0. A group-level error answers with no topics (OffsetDeleteRequest.getErrorResponse)."""

from __future__ import annotations

import dataclasses
from typing import Any

from coordinator.group import api
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
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
    request = to_request(header, body)
    # KafkaApis: DELETE on the group (a group-level error), then READ on each topic (its partitions refused)
    if not ctx.allows(Operation.DELETE, ResourceType.GROUP, request.group_id):
        return to_response(header.api_version, api.OffsetDeleteResponse(Errors.GROUP_AUTHORIZATION_FAILED))
    denied = [t for t in request.topics if not ctx.allows(Operation.READ, ResourceType.TOPIC, t.name)]
    if denied:
        request = dataclasses.replace(request, topics=[t for t in request.topics if t not in denied])
    response = await ctx.coordinator.delete_offsets(request)
    if denied and response.error_code == Errors.NONE:  # OffsetDeleteResponse.Builder.merge: a group error wins
        response = dataclasses.replace(response, topics=[*(api.OffsetDeleteResponseTopic(t.name, [
            api.OffsetDeleteResponsePartition(p, Errors.TOPIC_AUTHORIZATION_FAILED) for p in t.partition_indexes])
            for t in denied), *response.topics])
    return to_response(header.api_version, response)
