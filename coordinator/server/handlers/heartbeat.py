"""Heartbeat (12): the hot path. The response is hand-packed by protocol.fastpath from the kio object returned
here; the objects are cached per (version, error) since they are immutable."""

from __future__ import annotations

from functools import cache
from typing import Any

from coordinator.group import api
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.messages import ZERO_DURATION, build, error

API_KEY = ApiKey.HEARTBEAT


@cache
def to_response(version: int, error_code: int) -> Any:
    return build(response_class(API_KEY, version), throttle_time=ZERO_DURATION, error_code=error(error_code))


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    version = header.api_version
    request = api.HeartbeatRequest(
        body.group_id,
        body.generation_id,
        body.member_id,
        body.group_instance_id if version >= 3 else None,
        version,
    )
    response = await ctx.coordinator.heartbeat(request)
    return to_response(version, response.error_code)
