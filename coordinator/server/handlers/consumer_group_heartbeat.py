"""ConsumerGroupHeartbeat (68): the KIP-848 protocol's join, heartbeat and leave (coordinator/group/modern).
v1 (KIP-1082) requires the client to generate its member id. The body is kio's payload, or the hand reader's
ConsumerGroupHeartbeatFields (protocol.fastpath: same field names) for a request in its usual shape; the steady
heartbeat (every field after the epoch null) is answered from its frame by `steady_frame` when nothing else is
due, and a member's same steady bytes again with the same answer bytes while nothing it came from changed
(`SteadyAnswers`, coordinator/group/modern/steady.py)."""

from __future__ import annotations

import datetime
from collections.abc import Awaitable
from typing import Any

from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
from coordinator.group.modern.steady import SteadyMember
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader, encode_response
from protocol.consumer_group_heartbeat import pack_steady_answer, read_steady_heartbeat
from protocol.error_codes import Errors
from protocol.fastpath import pack_consumer_group_heartbeat_response
from protocol.messages import ZERO_DURATION, build, error, item_class, ms

API_KEY = ApiKey.CONSUMER_GROUP_HEARTBEAT
VERSIONS = (0, 1)


def to_request(ctx: ConnectionContext, header: RequestHeader, body: Any) -> HeartbeatRequest:
    owned = body.topic_partitions
    return HeartbeatRequest(
        group_id=body.group_id,
        member_id=body.member_id,
        member_epoch=int(body.member_epoch),
        instance_id=body.instance_id,
        rack_id=body.rack_id,
        rebalance_timeout_ms=ms(body.rebalance_timeout),
        subscribed_topic_names=None if body.subscribed_topic_names is None else tuple(body.subscribed_topic_names),
        subscribed_topic_regex=getattr(body, "subscribed_topic_regex", None),
        server_assignor=body.server_assignor,
        owned=None if owned is None else [(tp.topic_id, tuple(int(p) for p in tp.partitions)) for tp in owned],
        client_id=header.client_id or "",
        client_host=ctx.client_host,
        version=header.api_version,
        describable_topics=ctx.describable_topics if ctx.authorizer is not None else None,
    )


def to_response(version: int, response: HeartbeatResponse) -> Any:
    cls = response_class(API_KEY, version)
    assignment = None
    if response.assignment is not None:
        assignment_class = item_class(cls, "assignment")
        partitions_class = item_class(assignment_class, "topic_partitions")
        assignment = assignment_class(topic_partitions=tuple(
            partitions_class(topic_id=topic_id, partitions=tuple(ps)) for topic_id, ps in response.assignment.items()))
    return build(cls, throttle_time=ZERO_DURATION, error_code=error(response.error),
                 error_message=response.message, member_id=response.member_id, member_epoch=response.member_epoch,
                 heartbeat_interval=datetime.timedelta(milliseconds=response.heartbeat_interval_ms),
                 assignment=assignment)


def to_frame(header: RequestHeader, response: HeartbeatResponse) -> bytes:
    if response.error == Errors.NONE:  # the steady state, packed by hand; errors take kio's writer
        return pack_consumer_group_heartbeat_response(
            header.correlation_id, Errors.NONE, response.message, response.member_id, response.member_epoch,
            response.heartbeat_interval_ms, response.assignment)
    return encode_response(header, to_response(header.api_version, response))


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> bytes:
    outcome = start(ctx, header, body)
    if isinstance(outcome, bytes):
        return outcome
    return to_frame(header, await outcome)


def start(ctx: ConnectionContext, header: RequestHeader, body: Any) -> bytes | Awaitable[HeartbeatResponse]:
    """`handle` without a coroutine, for the connection: the answer's frame, or what to await for the response
    (to be packed by `to_frame`)."""
    # KafkaApis: READ on the group, then DESCRIBE on every subscribed topic named (no message, as Kafka's)
    if not ctx.allows(Operation.READ, ResourceType.GROUP, body.group_id):
        return to_frame(header, HeartbeatResponse(Errors.GROUP_AUTHORIZATION_FAILED))
    if body.subscribed_topic_names and not all(
            ctx.allows(Operation.DESCRIBE, ResourceType.TOPIC, name) for name in set(body.subscribed_topic_names)):
        return to_frame(header, HeartbeatResponse(Errors.TOPIC_AUTHORIZATION_FAILED))
    outcome = ctx.coordinator.start_consumer_group_heartbeat(to_request(ctx, header, body))
    if isinstance(outcome, HeartbeatResponse):
        return to_frame(header, outcome)
    return outcome


class _Answered:
    """A steady heartbeat answered on this connection: the member's SteadyMember and the answer's bytes around the
    correlation id."""

    __slots__ = ("version", "group_id", "member_id", "steady", "size", "tail")

    def __init__(self, version: int, group_id: str, member_id: str, steady: SteadyMember, answer: bytes) -> None:
        self.version, self.group_id, self.member_id, self.steady = version, group_id, member_id, steady
        self.size, self.tail = answer[:4], answer[8:]


class SteadyAnswers:
    """A connection's steady heartbeats, by their bytes after the correlation id (client id, group id, member id,
    epoch, the null fields): those bytes again mean the same request. One entry per member (its latest request);
    at most MAX_ENTRIES, all forgotten beyond that (a connection usually carries one member; a load generator's,
    a few hundred)."""

    MAX_ENTRIES = 4_096
    __slots__ = ("by_request", "_by_member", "hits", "max_entries")

    def __init__(self) -> None:
        self.by_request: dict[bytes, _Answered] = {}
        self._by_member: dict[tuple[str, str], bytes] = {}
        self.hits = 0  # heartbeats answered again
        self.max_entries = self.MAX_ENTRIES  # (a test sets a smaller bound)

    def keep(self, key: bytes, answered: _Answered) -> None:
        member = (answered.group_id, answered.member_id)
        before = self._by_member.get(member)
        if before is not None:
            self.by_request.pop(before, None)
        elif len(self._by_member) >= self.max_entries:
            self.by_request.clear()
            self._by_member.clear()
        self.by_request[key] = answered
        self._by_member[member] = key

    def forget(self, key: bytes) -> None:
        answered = self.by_request.pop(key, None)
        if answered is not None:
            self._by_member.pop((answered.group_id, answered.member_id), None)


def steady_frame(ctx: ConnectionContext, frame: bytes) -> bytes | None:
    """The answer's frame to a steady heartbeat (protocol.consumer_group_heartbeat's shape) that the group logic's
    steady shortcut answers with nothing to wait for or look at (GroupRuntime.steady_consumer_group_heartbeat);
    None: the general path serves the frame (nothing was changed). The same bytes from the same member again are
    answered with the same bytes while nothing it was answered from changed (GroupRuntime.steady_again), without
    reading the request again."""
    answers = ctx.steady_answers
    if answers is not None:
        key = frame[8:]
        answered = answers.by_request.get(key)
        if answered is not None:
            if (frame[3] == answered.version and (ctx.authorizer is None or ctx.allows(
                    Operation.READ, ResourceType.GROUP, answered.group_id))
                    and ctx.coordinator.steady_again(answered.steady)):
                answers.hits += 1
                return answered.size + frame[4:8] + answered.tail
            answers.forget(key)
    read = read_steady_heartbeat(frame)
    if read is None:
        return None
    version, correlation_id, client_id, group_id, member_id, member_epoch = read
    if ctx.authorizer is not None and not ctx.allows(Operation.READ, ResourceType.GROUP, group_id):
        return None  # the general path answers the refusal
    steady = getattr(ctx.coordinator, "steady_consumer_group_heartbeat", None)
    if steady is None:
        return None
    response = steady(HeartbeatRequest(group_id, member_id, member_epoch, client_id=client_id or "",
                                       client_host=ctx.client_host, version=version,
                                       describable_topics=ctx.describable_topics if ctx.authorizer is not None
                                       else None))
    if response is None:
        return None
    if response.error != Errors.NONE or response.message is not None or response.assignment is not None:
        return to_frame(RequestHeader(API_KEY, version, correlation_id, client_id), response)
    answer = pack_steady_answer(correlation_id, response.member_id or "", response.member_epoch,
                                response.heartbeat_interval_ms)
    _keep(ctx, frame, version, group_id, member_id, response, answer)
    return answer


def _keep(ctx: ConnectionContext, frame: bytes, version: int, group_id: str, member_id: str,
          response: HeartbeatResponse, answer: bytes) -> None:
    """The member's steady answer kept for its next steady heartbeats on this connection (if the group logic says
    what it came from, and that is what was answered)."""
    remember = getattr(ctx.coordinator, "steady_member", None)
    steady = remember(group_id, member_id) if remember is not None else None
    if (steady is None or steady.member_id != response.member_id or steady.member_epoch != response.member_epoch
            or steady.heartbeat_interval_ms != response.heartbeat_interval_ms):
        return
    if ctx.steady_answers is None:
        ctx.steady_answers = SteadyAnswers()
    ctx.steady_answers.keep(frame[8:], _Answered(version, group_id, member_id, steady, answer))
