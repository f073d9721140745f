"""SyncGroup (14). Followers park until the leader's assignment is stored.

The request arrives read by hand (protocol.group_fastpath's SyncGroupFields) or, in an unusual shape, as a kio
payload; the response is packed by hand."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from coordinator.group import api
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from protocol.group_fastpath import SyncGroupFields, pack_sync_group_response, sync_group_fields

API_KEY = ApiKey.SYNC_GROUP
VERSIONS = (0, 5)
# Module names for the Enum members every SyncGroup uses: a class attribute of an Enum costs ten times a global's.
_READ, _GROUP = Operation.READ, ResourceType.GROUP


def to_request(ctx: ConnectionContext, header: RequestHeader, fields: SyncGroupFields) -> api.SyncGroupRequest:
    # positional (a third of the keywords' cost, once per member and rebalance), in SyncGroupRequest's field order
    # (tests/unit/test_group_fastpath.py checks it against the keywords)
    return api.SyncGroupRequest(
        fields.group_id, fields.generation_id, fields.member_id, fields.group_instance_id, fields.protocol_type,
        fields.protocol_name,
        [api.SyncGroupRequestAssignment(member_id, assignment) for member_id, assignment in fields.assignments]
        if fields.assignments else [],
        header.api_version, header.client_id or "", ctx.client_host)


def to_frame(header: RequestHeader, response: api.SyncGroupResponse) -> bytes:
    return pack_sync_group_response(header.api_version, header.correlation_id, response.error_code,
                                    response.protocol_type, response.protocol_name, response.assignment)


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> bytes:
    outcome = start(ctx, header, body)
    if isinstance(outcome, bytes):
        return outcome
    return to_frame(header, await outcome)


def start(ctx: ConnectionContext, header: RequestHeader, body: Any
          ) -> bytes | Awaitable[api.SyncGroupResponse]:
    """`handle` without a coroutine, for the connection: the answer's frame, or what to await for the response
    (to be packed by `to_frame`)."""
    fields = body if type(body) is SyncGroupFields else sync_group_fields(body)
    # KafkaApis checks this before the coordinator: v5+ must name the protocol type and name.
    if header.api_version >= 5 and (fields.protocol_type is None or fields.protocol_name is None):
        return to_frame(header, api.SyncGroupResponse(Errors.INCONSISTENT_GROUP_PROTOCOL))
    if not ctx.allows(_READ, _GROUP, fields.group_id):
        return to_frame(header, api.SyncGroupResponse(Errors.GROUP_AUTHORIZATION_FAILED))
    coordinator = ctx.coordinator
    request = to_request(ctx, header, fields)
    begin = getattr(coordinator, "start_sync_group", None)  # a service without it serves through the coroutine
    outcome = coordinator.sync_group(request) if begin is None else begin(request)
    if isinstance(outcome, api.SyncGroupResponse):
        return to_frame(header, outcome)
    return outcome
