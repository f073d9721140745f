"""ConsumerGroupHeartbeat (68): the KIP-848 protocol's join, heartbeat and leave (coordinator/group/modern).
v1 (KIP-1082) requires the client to generate its member id. The body is kio's payload, or the hand reader's
ConsumerGroupHeartbeatFields (protocol.fastpath: same field names) for a request in its usual shape; the steady
heartbeat (every field after the epoch null) is answered from its frame by `steady_frame` when nothing else is
due."""

from __future__ import annotations

import datetime
from collections.abc import Awaitable
from typing import Any

from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader, encode_response
from protocol.consumer_group_heartbeat import pack_steady_answer, read_steady_heartbeat
from protocol.error_codes import Errors
from protocol.fastpath import pack_consumer_group_heartbeat_response
from protocol.messages import ZERO_DURATION, build, error, item_class, ms

API_KEY = ApiKey.CONSUMER_GROUP_HEARTBEAT
VERSIONS = (0, 1)


def to_request(ctx: ConnectionContext, header: RequestHeader, body: Any) -> HeartbeatRequest:
    owned = body.topic_partitions
    return HeartbeatRequest(
        group_id=body.group_id,
        member_id=body.member_id,
        member_epoch=int(body.member_epoch),
        instance_id=body.instance_id,
        rack_id=body.rack_id,
        rebalance_timeout_ms=ms(body.rebalance_timeout),
        subscribed_topic_names=None if body.subscribed_topic_names is None else tuple(body.subscribed_topic_names),
        subscribed_topic_regex=getattr(body, "subscribed_topic_regex", None),
        server_assignor=body.server_assignor,
        owned=None if owned is None else [(tp.topic_id, tuple(int(p) for p in tp.partitions)) for tp in owned],
        client_id=header.client_id or "",
        client_host=ctx.client_host,
        version=header.api_version,
        describable_topics=ctx.describable_topics if ctx.authorizer is not None else None,
    )


def to_response(version: int, response: HeartbeatResponse) -> Any:
    cls = response_class(API_KEY, version)
    assignment = None
    if response.assignment is not None:
        assignment_class = item_class(cls, "assignment")
        partitions_class = item_class(assignment_class, "topic_partitions")
        assignment = assignment_class(topic_partitions=tuple(
            partitions_class(topic_id=topic_id, partitions=tuple(ps)) for topic_id, ps in response.assignment.items()))
    return build(cls, throttle_time=ZERO_DURATION, error_code=error(response.error),
                 error_message=response.message, member_id=response.member_id, member_epoch=response.member_epoch,
                 heartbeat_interval=datetime.timedelta(milliseconds=response.heartbeat_interval_ms),
                 assignment=assignment)


def to_frame(header: RequestHeader, response: HeartbeatResponse) -> bytes:
    if response.error == Errors.NONE:  # the steady state, packed by hand; errors take kio's writer
        return pack_consumer_group_heartbeat_response(
            header.correlation_id, Errors.NONE, response.message, response.member_id, response.member_epoch,
            response.heartbeat_interval_ms, response.assignment)
    return encode_response(header, to_response(header.api_version, response))


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> bytes:
    outcome = start(ctx, header, body)
    if isinstance(outcome, bytes):
        return outcome
    return to_frame(header, await outcome)


def start(ctx: ConnectionContext, header: RequestHeader, body: Any) -> bytes | Awaitable[HeartbeatResponse]:
    """`handle` without a coroutine, for the connection: the answer's frame, or what to await for the response
    (to be packed by `to_frame`)."""
    # KafkaApis: READ on the group, then DESCRIBE on every subscribed topic named (no message, as Kafka's)
    if not ctx.allows(Operation.READ, ResourceType.GROUP, body.group_id):
        return to_frame(header, HeartbeatResponse(Errors.GROUP_AUTHORIZATION_FAILED))
    if body.subscribed_topic_names and not all(
            ctx.allows(Operation.DESCRIBE, ResourceType.TOPIC, name) for name in set(body.subscribed_topic_names)):
        return to_frame(header, HeartbeatResponse(Errors.TOPIC_AUTHORIZATION_FAILED))
    outcome = ctx.coordinator.start_consumer_group_heartbeat(to_request(ctx, header, body))
    if isinstance(outcome, HeartbeatResponse):
        return to_frame(header, outcome)
    return outcome


def steady_frame(ctx: ConnectionContext, frame: bytes) -> bytes | None:
    """The answer's frame to a steady heartbeat (protocol.consumer_group_heartbeat's shape) that the group logic's
    steady shortcut answers with nothing to wait for or look at (GroupRuntime.steady_consumer_group_heartbeat);
    None: the general path serves the frame (nothing was changed)."""
    read = read_steady_heartbeat(frame)
    if read is None:
        return None
    version, correlation_id, client_id, group_id, member_id, member_epoch = read
    if ctx.authorizer is not None and not ctx.allows(Operation.READ, ResourceType.GROUP, group_id):
        return None  # the general path answers the refusal
    steady = getattr(ctx.coordinator, "steady_consumer_group_heartbeat", None)
    if steady is None:
        return None
    response = steady(HeartbeatRequest(group_id, member_id, member_epoch, client_id=client_id or "",
                                       client_host=ctx.client_host, version=version,
                                       describable_topics=ctx.describable_topics if ctx.authorizer is not None
                                       else None))
    if response is None:
        return None
    if response.error != Errors.NONE or response.message is not None or response.assignment is not None:
        return to_frame(RequestHeader(API_KEY, version, correlation_id, client_id), response)
    return pack_steady_answer(correlation_id, response.member_id or "", response.member_epoch,
                              response.heartbeat_interval_ms)
