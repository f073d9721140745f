"""ListGroups (16)."""

from __future__ import annotations

import dataclasses
from typing import Any

from coordinator.group import api
from coordinator.security.authorizer import CLUSTER_NAME, Operation, ResourceType
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY = ApiKey.LIST_GROUPS
VERSIONS = (0, 5)


def to_request(header: RequestHeader, body: Any) -> api.ListGroupsRequest:
    return api.ListGroupsRequest(
        states_filter=list(getattr(body, "states_filter", ())),
        types_filter=list(getattr(body, "types_filter", ())),
        version=header.api_version,
    )


def to_response(version: int, response: api.ListGroupsResponse) -> Any:
    cls = response_class(API_KEY, version)
    group_class = item_class(cls, "groups")
    groups = tuple(
        build(group_class, group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.group_state,
              group_type=g.group_type)
        for g in response.groups
    )
    return build(cls, throttle_time=ZERO_DURATION, error_code=error(response.error_code), groups=groups)


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    response = await ctx.coordinator.list_groups(to_request(header, body))
    # KafkaApis: DESCRIBE on the cluster lists every group; else only the groups the client may describe
    if not ctx.allows(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        response = dataclasses.replace(response, groups=[
            g for g in response.groups if ctx.allows(Operation.DESCRIBE, ResourceType.GROUP, g.group_id)])
    return to_response(header.api_version, response)
