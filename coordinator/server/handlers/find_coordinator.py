"""FindCoordinator (10). One instance coordinates every group; several instances (coordinator/cluster) answer
the owner of the group's state-topic partition, and COORDINATOR_NOT_AVAILABLE while it is unknown (the partition
is moving: clients retry). Transactions are the cluster's: with the relay the request goes to it and its answer
comes back with the broker address rewritten; without it, COORDINATOR_NOT_AVAILABLE. v0–3 carry one key, v4+ a
batch with one answer per key (reference §3.10); a batch has one key type for all its keys, so a batch is either
all ours or all the cluster's."""

from __future__ import annotations

from typing import Any

from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext, Node
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY = ApiKey.FIND_COORDINATOR
VERSIONS = (0, 6)
_GROUP_KEY_TYPE = 0
_TRANSACTION_KEY_TYPE = 1
_MESSAGES = {
    Errors.GROUP_AUTHORIZATION_FAILED: "Group authorization failed.",
    Errors.COORDINATOR_NOT_AVAILABLE: "The coordinator is not available.",
    Errors.INVALID_REQUEST: "This most likely occurs because of a request being malformed by the client library or "
    "the message was sent to an incompatible broker. See the broker logs for more details.",
}


def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    cls = response_class(API_KEY, header.api_version)
    key_type = getattr(body, "key_type", _GROUP_KEY_TYPE)
    if key_type == _TRANSACTION_KEY_TYPE and ctx.relay is not None:
        return ctx.relay.transaction_coordinators(body)  # a coroutine: the connection awaits it
    code = _error_for(key_type)
    if header.api_version >= 4:
        entry = item_class(cls, "coordinators")
        coordinators = tuple(_located(entry, _coordinator(ctx, key, allowed), allowed, batch=True, key=key)
                             for key in body.coordinator_keys for allowed in (_authorized(ctx, key_type, key, code),))
        return build(cls, throttle_time=ZERO_DURATION, coordinators=coordinators)
    code = _authorized(ctx, key_type, body.key, code)
    return _located(cls, _coordinator(ctx, body.key, code), code, throttle_time=ZERO_DURATION)


def _authorized(ctx: ConnectionContext, key_type: int, key: str, code: Errors) -> Errors:
    """KafkaApis.getCoordinator: DESCRIBE on the group before anything else about it."""
    if key_type == _GROUP_KEY_TYPE and not ctx.allows(Operation.DESCRIBE, ResourceType.GROUP, key):
        return Errors.GROUP_AUTHORIZATION_FAILED
    return code


def _error_for(key_type: int) -> Errors:
    if key_type == _GROUP_KEY_TYPE:
        return Errors.NONE
    if key_type == _TRANSACTION_KEY_TYPE:
        return Errors.COORDINATOR_NOT_AVAILABLE
    return Errors.INVALID_REQUEST


def _coordinator(ctx: ConnectionContext, group_id: str, code: Errors) -> Node | None:
    if code != Errors.NONE:
        return None
    if ctx.directory is None:
        return ctx.node
    return ctx.directory.coordinator_node(group_id)


def _located(cls: type, node: Node | None, code: Errors, *, batch: bool = False, **extra: Any) -> Any:
    if node is None and code == Errors.NONE:
        code = Errors.COORDINATOR_NOT_AVAILABLE  # the group's owner is not known right now
    if node is None:  # Kafka's error shape: no node
        # v4+ KafkaApis sets no message on a key it refuses (the field's default, "")
        message = "" if batch and code == Errors.GROUP_AUTHORIZATION_FAILED else _MESSAGES[code]
        return build(cls, error_code=error(code), error_message=message, node_id=-1, host="", port=-1, **extra)
    return build(cls, error_code=error(code), error_message=None, node_id=node.node_id, host=node.host,
                 port=node.port, **extra)
