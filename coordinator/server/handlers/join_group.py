"""JoinGroup (11). May park in the group's DelayedJoin for up to the rebalance timeout."""

from __future__ import annotations

from typing import Any

from coordinator.group import api
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.messages import ZERO_DURATION, build, error, item_class, ms

API_KEY = ApiKey.JOIN_GROUP
VERSIONS = (0, 9)


def to_request(ctx: ConnectionContext, header: RequestHeader, body: Any) -> api.JoinGroupRequest:
    session_timeout_ms = ms(body.session_timeout)
    # v0 has no rebalance timeout: Kafka uses the session timeout (JoinGroupRequest.maybeOverrideRebalanceTimeout).
    rebalance_timeout = getattr(body, "rebalance_timeout", None)
    return api.JoinGroupRequest(
        group_id=body.group_id,
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=session_timeout_ms if rebalance_timeout is None else ms(rebalance_timeout),
        member_id=body.member_id,
        group_instance_id=getattr(body, "group_instance_id", None),
        protocol_type=body.protocol_type,
        protocols=[api.JoinGroupProtocol(p.name, p.metadata) for p in body.protocols],
        reason=getattr(body, "reason", None),
        version=header.api_version,
        client_id=header.client_id or "",
        client_host=ctx.client_host,
    )


def to_response(version: int, response: api.JoinGroupResponse) -> Any:
    cls = response_class(API_KEY, version)
    member_class = item_class(cls, "members")
    protocol_name = response.protocol_name
    # Kafka's JoinGroupResponse: below v7 a null protocol name is written as "", from v7 "" is written as null.
    if version < 7 and protocol_name is None:
        protocol_name = ""
    elif version >= 7 and protocol_name == "":
        protocol_name = None
    members = tuple(
        build(member_class, member_id=m.member_id, group_instance_id=m.group_instance_id, metadata=m.metadata)
        for m in response.members
    )
    return build(
        cls,
        throttle_time=ZERO_DURATION,
        error_code=error(response.error_code),
        generation_id=response.generation_id,
        protocol_type=response.protocol_type,
        protocol_name=protocol_name,
        leader=response.leader,
        skip_assignment=response.skip_assignment,
        member_id=response.member_id,
        members=members,
    )


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    response = await ctx.coordinator.join_group(to_request(ctx, header, body))
    return to_response(header.api_version, response)
