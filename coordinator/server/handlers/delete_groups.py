"""DeleteGroups (42). KafkaApis de-duplicates the names before the coordinator sees them."""

from __future__ import annotations

from typing import Any

from coordinator.group import api
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY = ApiKey.DELETE_GROUPS
VERSIONS = (0, 2)


def to_response(version: int, response: api.DeleteGroupsResponse) -> Any:
    cls = response_class(API_KEY, version)
    result_class = item_class(cls, "results")
    results = tuple(result_class(group_id=r.group_id, error_code=error(r.error_code)) for r in response.results)
    return build(cls, throttle_time=ZERO_DURATION, results=results)


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    names = list(dict.fromkeys(body.groups_names))
    # KafkaApis: DELETE on each group; the refused ones answered after the coordinator's results
    allowed = [name for name in names if ctx.allows(Operation.DELETE, ResourceType.GROUP, name)]
    refused = [api.DeletableGroupResult(name, Errors.GROUP_AUTHORIZATION_FAILED) for name in names
               if name not in allowed]
    if not allowed:
        return to_response(header.api_version, api.DeleteGroupsResponse(refused))
    response = await ctx.coordinator.delete_groups(api.DeleteGroupsRequest(allowed, header.api_version))
    if refused:
        response = api.DeleteGroupsResponse([*response.results, *refused])
    return to_response(header.api_version, response)
