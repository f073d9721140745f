"""OffsetCommit (8), v2–9.

Kafka's KafkaApis first answers UNKNOWN_TOPIC_OR_PARTITION for topics or partitions missing from the cluster
metadata; we have no cluster metadata yet, so every partition goes to the group coordinator (docs/protocol.md).
"""

from __future__ import annotations

from typing import Any

from coordinator.group import api
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.messages import ZERO_DURATION, build, error, item_class, ms

API_KEY = ApiKey.OFFSET_COMMIT


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
    response = await ctx.coordinator.commit_offsets(to_request(ctx, header, body))
    return to_response(header.api_version, response)
