"""OffsetFetch (9), v1–9. v8+ asks for several groups at once: each goes to the coordinator on its own and
the answers are gathered in request order. v1 has no top-level error field: a group-level error is repeated on
every requested partition, as Kafka's OffsetFetchResponse does for old versions."""

from __future__ import annotations

import dataclasses
from typing import Any

from coordinator.group import api
from protocol.error_codes import Errors
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY = ApiKey.OFFSET_FETCH
VERSIONS = (1, 9)  # as Kafka 4.1.1: v0 is ZooKeeper-only, v10 (topic ids) is not served


def _topics(requested: Any) -> list[api.OffsetFetchRequestTopic] | None:
    if requested is None:
        return None
    return [api.OffsetFetchRequestTopic(t.name, list(t.partition_indexes)) for t in requested]


def to_requests(header: RequestHeader, body: Any) -> list[api.OffsetFetchRequest]:
    version = header.api_version
    require_stable = bool(getattr(body, "require_stable", False))
    if version >= 8:
        return [api.OffsetFetchRequest(g.group_id, _topics(g.topics), require_stable, version,
                                       getattr(g, "member_id", None), int(getattr(g, "member_epoch", -1)))
                for g in body.groups]
    return [api.OffsetFetchRequest(body.group_id, _topics(body.topics), require_stable, version)]


def _topic_entries(topic_class: type, response: api.OffsetFetchResponse, request: api.OffsetFetchRequest,
                   version: int) -> tuple[Any, ...]:
    partition_class = item_class(topic_class, "partitions")
    topics = response.topics
    if version < 2 and response.error_code != Errors.NONE:
        topics = [
            api.OffsetFetchResponseTopic(t.name, [
                api.OffsetFetchResponsePartition(p, error_code=response.error_code) for p in t.partition_indexes
            ])
            for t in request.topics or ()
        ]
    return tuple(
        topic_class(name=t.name, partitions=tuple(
            build(partition_class, partition_index=p.partition_index, committed_offset=p.committed_offset,
                  committed_leader_epoch=p.committed_leader_epoch, metadata=p.metadata,
                  error_code=error(p.error_code))
            for p in t.partitions
        ))
        for t in topics
    )


def to_response(version: int, requests: list[api.OffsetFetchRequest],
                responses: list[api.OffsetFetchResponse]) -> Any:
    cls = response_class(API_KEY, version)
    if version >= 8:
        group_class = item_class(cls, "groups")
        topic_class = item_class(group_class, "topics")
        groups = tuple(
            group_class(group_id=r.group_id, topics=_topic_entries(topic_class, r, q, version),
                        error_code=error(r.error_code))
            for q, r in zip(requests, responses)
        )
        return build(cls, throttle_time=ZERO_DURATION, groups=groups)
    response, request = responses[0], requests[0]
    topics = _topic_entries(item_class(cls, "topics"), response, request, version)
    return build(cls, throttle_time=ZERO_DURATION, topics=topics, error_code=error(response.error_code))


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    requests = to_requests(header, body)
    responses = [await _fetch_authorized(ctx, request) for request in requests]
    return to_response(header.api_version, requests, responses)


async def _fetch_authorized(ctx: ConnectionContext, request: api.OffsetFetchRequest) -> api.OffsetFetchResponse:
    """KafkaApis: DESCRIBE on the group; offsets only of topics the client may describe: named ones it may not
    are answered offset -1 and TOPIC_AUTHORIZATION_FAILED, after the others; with "all topics" they are left out."""
    if not ctx.allows(Operation.DESCRIBE, ResourceType.GROUP, request.group_id):
        return api.OffsetFetchResponse(request.group_id, Errors.GROUP_AUTHORIZATION_FAILED)
    if request.topics is None:
        response = await ctx.coordinator.fetch_offsets(request)
        if response.error_code == Errors.NONE:
            response.topics = [t for t in response.topics
                               if ctx.allows(Operation.DESCRIBE, ResourceType.TOPIC, t.name)]
        return response
    denied = [t for t in request.topics if not ctx.allows(Operation.DESCRIBE, ResourceType.TOPIC, t.name)]
    if not denied:
        return await ctx.coordinator.fetch_offsets(request)
    allowed = dataclasses.replace(request, topics=[t for t in request.topics if t not in denied])
    response = await ctx.coordinator.fetch_offsets(allowed)
    if response.error_code == Errors.NONE:
        response.topics = [*response.topics, *(
            api.OffsetFetchResponseTopic(t.name, [api.OffsetFetchResponsePartition(
                p, error_code=Errors.TOPIC_AUTHORIZATION_FAILED) for p in t.partition_indexes]) for t in denied)]
    return response
