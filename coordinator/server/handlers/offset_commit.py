"""OffsetCommit (8), v2–9.

Like Kafka 3.9's KafkaApis, partitions the cluster does not have are answered UNKNOWN_TOPIC_OR_PARTITION here,
before the group coordinator sees the request; only the others go to the group (and if none is left, the group
is not asked at all). The cluster's partitions come from the relay's metadata cache, refreshed on a miss before
refusing. Without the relay (--no-relay) we know no cluster and every partition goes to the group.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from coordinator.group import api
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from protocol.messages import ZERO_DURATION, build, error, item_class, ms

API_KEY = ApiKey.OFFSET_COMMIT
VERSIONS = (2, 9)  # as Kafka 4.1.1: v0-1 are ZooKeeper-only, v10 (topic ids) is not served


def to_request(ctx: ConnectionContext, header: RequestHeader, body: Any) -> api.OffsetCommitRequest:
    retention = getattr(body, "retention_time", None)  # v2-4
    return api.OffsetCommitRequest(
        group_id=body.group_id,
        generation_id=body.generation_id_or_member_epoch,
        member_id=body.member_id,
        topics=[
            api.OffsetCommitRequestTopic(topic.name, [_partition(p) for p in topic.partitions]) for topic in body.topics
        ],
        group_instance_id=getattr(body, "group_instance_id", None),
        retention_time_ms=-1 if retention is None else ms(retention),
        version=header.api_version,
    )


def _partition(partition: Any) -> api.OffsetCommitRequestPartition:
    return api.OffsetCommitRequestPartition(
        partition_index=partition.partition_index,
        committed_offset=partition.committed_offset,
        committed_leader_epoch=getattr(partition, "committed_leader_epoch", -1),
        committed_metadata=partition.committed_metadata,
    )


def to_response(version: int, response: api.OffsetCommitResponse) -> Any:
    cls = response_class(API_KEY, version)
    topic_class = item_class(cls, "topics")
    partition_class = item_class(topic_class, "partitions")
    topics = tuple(
        topic_class(
            name=topic.name,
            partitions=tuple(
                partition_class(partition_index=p.partition_index, error_code=error(p.error_code))
                for p in topic.partitions
            ),
        )
        for topic in response.topics
    )
    return build(cls, throttle_time=ZERO_DURATION, topics=topics)




async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    request = to_request(ctx, header, body)
    # KafkaApis: READ on the group (else every partition refused), then READ on each topic, before existence
    if not ctx.allows(Operation.READ, ResourceType.GROUP, request.group_id):
        return to_response(header.api_version, api.OffsetCommitResponse(
            topics=_answered(request.topics, Errors.GROUP_AUTHORIZATION_FAILED)))
    denied = [t for t in request.topics if not ctx.allows(Operation.READ, ResourceType.TOPIC, t.name)]
    if denied:
        request = dataclasses.replace(request, topics=[t for t in request.topics if t not in denied])
        response = await _commit_known(ctx, request) if request.topics else api.OffsetCommitResponse(topics=[])
        return to_response(header.api_version, dataclasses.replace(response, topics=[
            *_answered(denied, Errors.TOPIC_AUTHORIZATION_FAILED), *response.topics]))
    return to_response(header.api_version, await _commit_known(ctx, request))


def _answered(topics: list[api.OffsetCommitRequestTopic], code: Errors) -> list[api.OffsetCommitResponseTopic]:
    return [api.OffsetCommitResponseTopic(t.name, [api.OffsetCommitResponsePartition(p.partition_index, code)
                                                   for p in t.partitions]) for t in topics]


async def _commit_known(ctx: ConnectionContext, request: api.OffsetCommitRequest) -> api.OffsetCommitResponse:
    if ctx.relay is None:
        return await ctx.coordinator.commit_offsets(request)
    wanted = [(topic.name, p.partition_index) for topic in request.topics for p in topic.partitions]
    missing = await ctx.relay.cluster.missing(wanted)
    if not missing:
        return await ctx.coordinator.commit_offsets(request)
    known_topics = [
        api.OffsetCommitRequestTopic(topic.name, kept)
        for topic in request.topics
        if (kept := [p for p in topic.partitions if (topic.name, p.partition_index) not in missing])
    ]
    refused = _refused(request, missing)
    if not known_topics:
        return api.OffsetCommitResponse(topics=refused)
    request = dataclasses.replace(request, topics=known_topics)
    response = await ctx.coordinator.commit_offsets(request)
    return dataclasses.replace(response, topics=refused + list(response.topics))


def _refused(request: api.OffsetCommitRequest, missing: set[tuple[str, int]]) -> list[Any]:
    topics = []
    for topic in request.topics:
        partitions = [api.OffsetCommitResponsePartition(p.partition_index, Errors.UNKNOWN_TOPIC_OR_PARTITION)
                      for p in topic.partitions if (topic.name, p.partition_index) in missing]
        if partitions:
            topics.append(api.OffsetCommitResponseTopic(topic.name, partitions))
    return topics
