"""LeaveGroup (13). v0–2 name one member; v3+ a batch (reference §3.0)."""

from __future__ import annotations

from typing import Any

from coordinator.group import api
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY = ApiKey.LEAVE_GROUP
VERSIONS = (0, 5)


def to_request(ctx: ConnectionContext, header: RequestHeader, body: Any) -> api.LeaveGroupRequest:
    if header.api_version < 3:
        members = [api.MemberIdentity(body.member_id)]
    else:
        members = [
            api.MemberIdentity(m.member_id, m.group_instance_id, getattr(m, "reason", None)) for m in body.members
        ]
    return api.LeaveGroupRequest(
        group_id=body.group_id,
        members=members,
        version=header.api_version,
        client_id=header.client_id or "",
        client_host=ctx.client_host,
    )


def to_response(version: int, response: api.LeaveGroupResponse) -> Any:
    cls = response_class(API_KEY, version)
    if version < 3:
        return build(cls, throttle_time=ZERO_DURATION, error_code=error(response.legacy_error_code()))
    member_class = item_class(cls, "members")
    members = tuple(
        member_class(member_id=m.member_id, group_instance_id=m.group_instance_id, error_code=error(m.error_code))
        for m in response.members
    )
    return build(cls, throttle_time=ZERO_DURATION, error_code=error(response.error_code), members=members)


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    if not ctx.allows(Operation.READ, ResourceType.GROUP, body.group_id):
        return to_response(header.api_version, api.LeaveGroupResponse(Errors.GROUP_AUTHORIZATION_FAILED))
    response = await ctx.coordinator.leave_group(to_request(ctx, header, body))
    return to_response(header.api_version, response)
