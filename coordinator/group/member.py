"""A member of a classic group (Kafka 3.9 `MemberMetadata.scala`)."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from coordinator.group.api import JoinGroupProtocol

if TYPE_CHECKING:
    from coordinator.group.api import JoinGroupResponse, SyncGroupResponse

Protocols = list[JoinGroupProtocol]  # in the client's order of preference, as the JoinGroup request gave them


class AnswersInPass(Protocol):
    """Who answers a parked JoinGroup, SyncGroup or written ConsumerGroupHeartbeat in the pass that completes it
    (ANSWERED_IN_PASS): the connection waiting for it, registered as itself (no bound method per parked request)."""

    def answer_in_pass(self, future: asyncio.Future[Any], response: Any) -> None: ...


# A parked JoinGroup's, SyncGroup's or written ConsumerGroupHeartbeat's future -> who answers it in the very call
# that completes it (the connection waiting for it, coordinator/server/connection.py), registered while it waits.
# `GroupMetadata.complete_join` and `complete_sync` (a rebalance's answers, every member's in one pass; a removed
# member's; an unload's) and the settling of a consumer group's write (`answer_parked`) hand the response over
# instead of setting it: the answerer sets the future's result itself, with its done callback taken
# off first, and writes the answer then and there: no loop callback per member (a done callback costs ~1.2 µs of
# `call_soon` and the loop's run of it, 2,000 a 1,000-member rebalance). A future completed any other way (a
# `set_result` elsewhere: a superseded request, an answer given at once) goes as before, through its done callback,
# which takes the entry out.
ANSWERED_IN_PASS: dict[asyncio.Future[Any], AnswersInPass] = {}


def answer_parked(future: asyncio.Future[Any], response: object) -> None:
    """A parked request's answer (a rebalance's JoinGroup/SyncGroup, a written ConsumerGroupHeartbeat): its
    connection answers now, setting the result, when it is waiting in ANSWERED_IN_PASS; otherwise the future's
    result, through its done callback."""
    answerer = ANSWERED_IN_PASS.pop(future, None) if ANSWERED_IN_PASS else None
    if answerer is None:
        future.set_result(response)
    else:
        answerer.answer_in_pass(future, response)


class MemberMetadata:
    """A parked JoinGroup/SyncGroup is an asyncio.Future in `join_future`/`sync_future`; a future stays set
    (even if its request was cancelled) until the coordinator answers it, as Kafka keeps the callback."""

    __slots__ = (
        "member_id", "group_instance_id", "client_id", "client_host", "rebalance_timeout_ms",
        "session_timeout_ms", "protocol_type", "supported_protocols", "assignment", "join_future",
        "sync_future", "is_new", "heartbeat_deadline_ms", "heartbeat_op",
    )

    def __init__(
        self, member_id: str, group_instance_id: str | None, client_id: str, client_host: str,
        rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str, supported_protocols: Protocols,
    ) -> None:
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.session_timeout_ms = session_timeout_ms
        self.protocol_type = protocol_type
        self.supported_protocols = supported_protocols
        self.assignment = b""
        self.join_future: asyncio.Future[JoinGroupResponse] | None = None
        self.sync_future: asyncio.Future[SyncGroupResponse] | None = None
        self.is_new = False
        # Session tracking: the deadline moves on every heartbeat; `heartbeat_op` is the DelayedHeartbeat in
        # the timer, which re-checks the deadline when it fires (see GroupShard.schedule_heartbeat).
        self.heartbeat_deadline_ms = 0
        self.heartbeat_op: Any = None

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def is_awaiting_join(self) -> bool:
        return self.join_future is not None

    @property
    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.supported_protocols]

    def metadata(self, protocol: str) -> bytes:
        for name, metadata in self.supported_protocols:
            if name == protocol:
                return metadata
        raise KeyError(f"Member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: Protocols) -> bool:
        """Same protocols, same order, byte-equal metadata."""
        return len(protocols) == len(self.supported_protocols) and all(
            a[0] == b[0] and bytes(a[1]) == bytes(b[1]) for a, b in zip(protocols, self.supported_protocols)
        )

    def vote(self, candidates: set[str]) -> str:
        """The first protocol of this member's own list that every member supports."""
        for name, _ in self.supported_protocols:
            if name in candidates:
                return name
        raise ValueError(f"Member {self.member_id} does not support any of the candidate protocols")

    def __repr__(self) -> str:
        return (
            f"MemberMetadata(member_id={self.member_id}, group_instance_id={self.group_instance_id}, "
            f"client_id={self.client_id}, client_host={self.client_host}, "
            f"session_timeout_ms={self.session_timeout_ms}, rebalance_timeout_ms={self.rebalance_timeout_ms}, "
            f"supported_protocols={self.protocol_names})"
        )
