"""DescribeGroups (15)."""

from __future__ import annotations

from typing import Any

from coordinator.group import api
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY = ApiKey.DESCRIBE_GROUPS
VERSIONS = (0, 5)


def to_request(header: RequestHeader, body: Any) -> api.DescribeGroupsRequest:
    return api.DescribeGroupsRequest(
        groups=list(body.groups),
        include_authorized_operations=bool(getattr(body, "include_authorized_operations", False)),
        version=header.api_version,
    )


def to_response(version: int, response: api.DescribeGroupsResponse) -> Any:
    cls = response_class(API_KEY, version)
    group_class = item_class(cls, "groups")
    member_class = item_class(group_class, "members")
    groups = tuple(
        build(
            group_class,
            error_code=error(g.error_code),
            group_id=g.group_id,
            group_state=g.group_state,
            protocol_type=g.protocol_type,
            protocol_data=g.protocol_data,
            members=tuple(
                build(member_class, member_id=m.member_id, group_instance_id=m.group_instance_id,
                      client_id=m.client_id, client_host=m.client_host, member_metadata=m.member_metadata,
                      member_assignment=m.member_assignment)
                for m in g.members
            ),
            authorized_operations=g.authorized_operations,
        )
        for g in response.groups
    )
    return build(cls, throttle_time=ZERO_DURATION, groups=groups)


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    request = to_request(header, body)
    # KafkaApis: DESCRIBE on each group; the refused ones first, then the coordinator's answers
    refused = [api.DescribedGroup(Errors.GROUP_AUTHORIZATION_FAILED, group_id) for group_id in request.groups
               if not ctx.allows(Operation.DESCRIBE, ResourceType.GROUP, group_id)]
    if refused:
        request.groups = [g for g in request.groups if ctx.allows(Operation.DESCRIBE, ResourceType.GROUP, g)]
    response = await ctx.coordinator.describe_groups(request) if request.groups else api.DescribeGroupsResponse([])
    if request.include_authorized_operations and header.api_version >= 3:
        for group in response.groups:
            if group.error_code == Errors.NONE:
                group.authorized_operations = ctx.group_operations(group.group_id)
    if refused:
        response = api.DescribeGroupsResponse([*refused, *response.groups])
    return to_response(header.api_version, response)
