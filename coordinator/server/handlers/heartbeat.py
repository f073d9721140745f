"""Heartbeat (12): the hot path. The GroupRuntime answers heartbeats synchronously (`handle_heartbeat`), so
no coroutine is made; the response is hand-packed by protocol.fastpath from the kio object returned here, and
those objects are cached per (version, error) since they are immutable."""

from __future__ import annotations

from functools import cache
from typing import Any

from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from protocol.messages import ZERO_DURATION, build, error

API_KEY = ApiKey.HEARTBEAT
VERSIONS = (0, 4)


@cache
def to_response(version: int, error_code: int) -> Any:
    return build(response_class(API_KEY, version), throttle_time=ZERO_DURATION, error_code=error(error_code))


def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    version = header.api_version
    group_instance_id = body.group_instance_id if version >= 3 else None
    if not ctx.allows(Operation.READ, ResourceType.GROUP, body.group_id):
        return to_response(version, Errors.GROUP_AUTHORIZATION_FAILED)
    error_code = ctx.coordinator.handle_heartbeat(body.group_id, body.generation_id, body.member_id, group_instance_id)
    return to_response(version, error_code)
