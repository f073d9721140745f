"""SyncGroup (14). Followers park until the leader's assignment is stored."""

from __future__ import annotations

from typing import Any

from coordinator.group import api
from protocol.error_codes import Errors
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.messages import ZERO_DURATION, build, error

API_KEY = ApiKey.SYNC_GROUP
VERSIONS = (0, 5)


def to_request(ctx: ConnectionContext, header: RequestHeader, body: Any) -> api.SyncGroupRequest:
    return api.SyncGroupRequest(
        group_id=body.group_id,
        generation_id=body.generation_id,
        member_id=body.member_id,
        group_instance_id=getattr(body, "group_instance_id", None),
        protocol_type=getattr(body, "protocol_type", None),
        protocol_name=getattr(body, "protocol_name", None),
        assignments=[api.SyncGroupRequestAssignment(a.member_id, a.assignment) for a in body.assignments],
        version=header.api_version,
        client_id=header.client_id or "",
        client_host=ctx.client_host,
    )


def to_response(version: int, response: api.SyncGroupResponse) -> Any:
    return build(
        response_class(API_KEY, version),
        throttle_time=ZERO_DURATION,
        error_code=error(response.error_code),
        protocol_type=response.protocol_type,
        protocol_name=response.protocol_name,
        assignment=response.assignment,
    )


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    # KafkaApis checks this before the coordinator: v5+ must name the protocol type and name.
    if header.api_version >= 5 and (body.protocol_type is None or body.protocol_name is None):
        return to_response(header.api_version, api.SyncGroupResponse(Errors.INCONSISTENT_GROUP_PROTOCOL))
    response = await ctx.coordinator.sync_group(to_request(ctx, header, body))
    return to_response(header.api_version, response)
