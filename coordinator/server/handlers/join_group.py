"""JoinGroup (11). May park in the group's DelayedJoin for up to the rebalance timeout.

The request arrives read by hand (protocol.group_fastpath's JoinGroupFields) or, in an unusual shape, as a kio
payload; the response is packed by hand: the leader's carries every member's metadata, as the bytes each
member sent."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from coordinator.group import api
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from protocol.group_fastpath import JoinGroupFields, join_group_fields, new_tuple, pack_join_group_response

API_KEY = ApiKey.JOIN_GROUP
VERSIONS = (0, 9)
# Module names for the Enum members every JoinGroup uses: a class attribute of an Enum costs ten times a global's.
_NONE, _READ, _GROUP = Errors.NONE, Operation.READ, ResourceType.GROUP
_PROTOCOL = api.JoinGroupProtocol


def to_request(ctx: ConnectionContext, header: RequestHeader, fields: JoinGroupFields) -> api.JoinGroupRequest:
    # v0 has no rebalance timeout: Kafka uses the session timeout (JoinGroupRequest.maybeOverrideRebalanceTimeout).
    rebalance_timeout_ms = fields.rebalance_timeout_ms
    # positional (a third of the keywords' cost, once per member and rebalance), in JoinGroupRequest's field order
    # (tests/unit/test_group_fastpath.py checks it against the keywords)
    return api.JoinGroupRequest(
        fields.group_id, fields.session_timeout_ms,
        fields.session_timeout_ms if rebalance_timeout_ms is None else rebalance_timeout_ms,
        fields.member_id, fields.group_instance_id, fields.protocol_type,
        # each (name, metadata) pair made a JoinGroupProtocol in C (group_fastpath.new_tuple)
        [new_tuple(_PROTOCOL, pair) for pair in fields.protocols],
        fields.reason, header.api_version, header.client_id or "", ctx.client_host)


def to_frame(header: RequestHeader, response: api.JoinGroupResponse) -> bytes:
    version = header.api_version
    protocol_name = response.protocol_name
    # Kafka's JoinGroupResponse: below v7 a null protocol name is written as "", from v7 "" is written as null.
    if version < 7 and protocol_name is None:
        protocol_name = ""
    elif version >= 7 and protocol_name == "":
        protocol_name = None
    return pack_join_group_response(
        version, header.correlation_id, response.error_code, response.generation_id, response.protocol_type,
        protocol_name, response.leader, response.skip_assignment, response.member_id,
        [(m.member_id, m.group_instance_id, m.metadata) for m in response.members])


def answered_as_leader(response: api.JoinGroupResponse) -> bool:
    """The member this answer goes to leads the group: its SyncGroup will carry the assignment."""
    return response.error_code == _NONE and response.leader == response.member_id


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> bytes:
    outcome = start(ctx, header, body)
    if isinstance(outcome, bytes):
        return outcome
    return to_frame(header, await outcome)


def start(ctx: ConnectionContext, header: RequestHeader, body: Any
          ) -> bytes | Awaitable[api.JoinGroupResponse]:
    """`handle` without a coroutine, for the connection: the answer's frame, or what to await for the response
    (to be packed by `to_frame`)."""
    fields = body if type(body) is JoinGroupFields else join_group_fields(body)
    if not ctx.allows(_READ, _GROUP, fields.group_id):
        return to_frame(header, api.JoinGroupResponse(Errors.GROUP_AUTHORIZATION_FAILED))
    coordinator = ctx.coordinator
    request = to_request(ctx, header, fields)
    begin = getattr(coordinator, "start_join_group", None)  # a service without it serves through the coroutine
    outcome = coordinator.join_group(request) if begin is None else begin(request)
    if isinstance(outcome, api.JoinGroupResponse):
        return to_frame(header, outcome)
    return outcome
