"""Typed requests and responses of the group coordinator, one pair per Kafka API.

The wire layer maps kio messages to and from these. Field names are Kafka's in snake_case; every duration is an
int in milliseconds. `version` is the request's API version (the core applies Kafka's version-dependent rules:
KIP-394 member id round trip for JoinGroup v4+, skip-assignment for v9+). `client_id` and `client_host` come
from the connection; `client_host` is in Java's `InetAddress.toString()` form, e.g. "/127.0.0.1".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from protocol.error_codes import Errors

UNKNOWN_MEMBER_ID = ""  # JoinGroupRequest.UNKNOWN_MEMBER_ID
NO_GENERATION = -1
AUTHORIZED_OPERATIONS_OMITTED = -2147483648


# The classes a rebalance makes per member (its requests, answers and the leader's member list) have their
# `__init__` written out (init=False): compiled by mypyc, a dataclass's generated `__init__` stays interpreted
# (the dataclasses module makes it at import), ~0.12 µs more per object, ~6,000-8,000 objects a 1,000-member
# rebalance; written out it is compiled with the class. Same fields, order, defaults and keywords; __eq__ and
# __repr__ are still the dataclass's.


# --- JoinGroup (api key 11) -----------------------------------------------------------------------------------
class JoinGroupProtocol(NamedTuple):
    """One protocol a member supports, as sent and as kept in the member (a tuple: cheap, immutable)."""

    name: str
    metadata: bytes


@dataclass(slots=True, init=False)
class JoinGroupRequest:
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int  # v0: the wire layer copies session_timeout_ms here
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: list[JoinGroupProtocol]
    reason: str | None = None
    version: int = 9
    client_id: str = ""
    client_host: str = ""

    def __init__(self, group_id: str, session_timeout_ms: int, rebalance_timeout_ms: int, member_id: str,
                 group_instance_id: str | None, protocol_type: str, protocols: list[JoinGroupProtocol],
                 reason: str | None = None, version: int = 9, client_id: str = "", client_host: str = "") -> None:
        self.group_id = group_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.protocol_type = protocol_type
        self.protocols = protocols
        self.reason = reason
        self.version = version
        self.client_id = client_id
        self.client_host = client_host

    @property
    def require_known_member_id(self) -> bool:
        return self.version >= 4 and self.group_instance_id is None

    @property
    def supports_skip_assignment(self) -> bool:
        return self.version >= 9


@dataclass(slots=True, init=False)
class JoinGroupResponseMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes

    def __init__(self, member_id: str, group_instance_id: str | None, metadata: bytes) -> None:
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.metadata = metadata


@dataclass(slots=True, init=False)
class JoinGroupResponse:
    error_code: Errors
    member_id: str = ""
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None  # wire layer: None -> "" below v7
    leader: str = ""
    skip_assignment: bool = False
    members: list[JoinGroupResponseMember] = field(default_factory=list)

    def __init__(self, error_code: Errors, member_id: str = "", generation_id: int = NO_GENERATION,
                 protocol_type: str | None = None, protocol_name: str | None = None, leader: str = "",
                 skip_assignment: bool = False, members: list[JoinGroupResponseMember] | None = None) -> None:
        self.error_code = error_code
        self.member_id = member_id
        self.generation_id = generation_id
        self.protocol_type = protocol_type
        self.protocol_name = protocol_name
        self.leader = leader
        self.skip_assignment = skip_assignment
        self.members = [] if members is None else members


# --- SyncGroup (api key 14) -----------------------------------------------------------------------------------
@dataclass(slots=True, init=False)
class SyncGroupRequestAssignment:
    member_id: str
    assignment: bytes

    def __init__(self, member_id: str, assignment: bytes) -> None:
        self.member_id = member_id
        self.assignment = assignment


@dataclass(slots=True, init=False)
class SyncGroupRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    protocol_type: str | None = None  # v5+
    protocol_name: str | None = None  # v5+
    assignments: list[SyncGroupRequestAssignment] = field(default_factory=list)
    version: int = 5
    client_id: str = ""
    client_host: str = ""

    def __init__(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None = None,
                 protocol_type: str | None = None, protocol_name: str | None = None,
                 assignments: list[SyncGroupRequestAssignment] | None = None, version: int = 5,
                 client_id: str = "", client_host: str = "") -> None:
        self.group_id = group_id
        self.generation_id = generation_id
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.protocol_type = protocol_type
        self.protocol_name = protocol_name
        self.assignments = [] if assignments is None else assignments
        self.version = version
        self.client_id = client_id
        self.client_host = client_host


@dataclass(slots=True, init=False)
class SyncGroupResponse:
    error_code: Errors
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""

    def __init__(self, error_code: Errors, protocol_type: str | None = None, protocol_name: str | None = None,
                 assignment: bytes = b"") -> None:
        self.error_code = error_code
        self.protocol_type = protocol_type
        self.protocol_name = protocol_name
        self.assignment = assignment


# --- Heartbeat (api key 12) -----------------------------------------------------------------------------------
@dataclass(slots=True)
class HeartbeatRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    version: int = 4


@dataclass(slots=True)
class HeartbeatResponse:
    error_code: Errors


# --- LeaveGroup (api key 13) ----------------------------------------------------------------------------------
@dataclass(slots=True)
class MemberIdentity:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(slots=True)
class LeaveGroupRequest:
    group_id: str
    members: list[MemberIdentity]  # v0-2: the wire layer makes a one-element list
    version: int = 5
    client_id: str = ""
    client_host: str = ""


@dataclass(slots=True)
class LeaveGroupResponseMember:
    member_id: str
    group_instance_id: str | None
    error_code: Errors


@dataclass(slots=True)
class LeaveGroupResponse:
    error_code: Errors
    members: list[LeaveGroupResponseMember] = field(default_factory=list)

    def legacy_error_code(self) -> Errors:
        """v0-2 have no member list: the top-level error, else the first member error (LeaveGroupResponse.java)."""
        if self.error_code != Errors.NONE:
            return self.error_code
        return next((m.error_code for m in self.members if m.error_code != Errors.NONE), Errors.NONE)


# --- OffsetCommit (api key 8) ---------------------------------------------------------------------------------
@dataclass(slots=True)
class OffsetCommitRequestPartition:
    partition_index: int
    committed_offset: int
    committed_leader_epoch: int = -1
    committed_metadata: str | None = None
    commit_timestamp_ms: int = -1  # v1 only


@dataclass(slots=True)
class OffsetCommitRequestTopic:
    name: str
    partitions: list[OffsetCommitRequestPartition]


@dataclass(slots=True)
class OffsetCommitRequest:
    group_id: str
    generation_id: int  # GenerationIdOrMemberEpoch
    member_id: str
    topics: list[OffsetCommitRequestTopic]
    group_instance_id: str | None = None
    retention_time_ms: int = -1  # v2-4
    version: int = 9


@dataclass(slots=True)
class OffsetCommitResponsePartition:
    partition_index: int
    error_code: Errors


@dataclass(slots=True)
class OffsetCommitResponseTopic:
    name: str
    partitions: list[OffsetCommitResponsePartition]


@dataclass(slots=True)
class OffsetCommitResponse:
    topics: list[OffsetCommitResponseTopic]


# --- OffsetFetch (api key 9); one group per call (the wire layer splits v8+ multi-group requests) --------------
@dataclass(slots=True)
class OffsetFetchRequestTopic:
    name: str
    partition_indexes: list[int]


@dataclass(slots=True)
class OffsetFetchRequest:
    group_id: str
    topics: list[OffsetFetchRequestTopic] | None  # None = every partition with a committed offset
    require_stable: bool = False
    version: int = 9
    member_id: str | None = None  # v9+: a KIP-848 member asking, with its epoch (-1: an admin or plain client)
    member_epoch: int = -1


@dataclass(slots=True)
class OffsetFetchResponsePartition:
    partition_index: int
    committed_offset: int = -1
    committed_leader_epoch: int = -1
    metadata: str | None = ""
    error_code: Errors = Errors.NONE


@dataclass(slots=True)
class OffsetFetchResponseTopic:
    name: str
    partitions: list[OffsetFetchResponsePartition]


@dataclass(slots=True)
class OffsetFetchResponse:
    group_id: str
    error_code: Errors
    topics: list[OffsetFetchResponseTopic] = field(default_factory=list)


# --- DescribeGroups (api key 15) ------------------------------------------------------------------------------
@dataclass(slots=True)
class DescribeGroupsRequest:
    groups: list[str]
    include_authorized_operations: bool = False
    version: int = 5


@dataclass(slots=True)
class DescribedGroupMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    member_metadata: bytes
    member_assignment: bytes


@dataclass(slots=True)
class DescribedGroup:
    error_code: Errors
    group_id: str
    group_state: str = ""
    protocol_type: str = ""
    protocol_data: str = ""
    members: list[DescribedGroupMember] = field(default_factory=list)
    authorized_operations: int = AUTHORIZED_OPERATIONS_OMITTED


@dataclass(slots=True)
class DescribeGroupsResponse:
    groups: list[DescribedGroup]


# --- ListGroups (api key 16) ----------------------------------------------------------------------------------
@dataclass(slots=True)
class ListGroupsRequest:
    states_filter: list[str] = field(default_factory=list)  # v4+, case-insensitive; empty = all
    types_filter: list[str] = field(default_factory=list)  # v5+, case-insensitive; empty = all
    version: int = 5


@dataclass(slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    group_state: str
    group_type: str = "classic"


@dataclass(slots=True)
class ListGroupsResponse:
    error_code: Errors
    groups: list[ListedGroup] = field(default_factory=list)


# --- DeleteGroups (api key 42) --------------------------------------------------------------------------------
@dataclass(slots=True)
class DeleteGroupsRequest:
    groups_names: list[str]
    version: int = 2


@dataclass(slots=True)
class DeletableGroupResult:
    group_id: str
    error_code: Errors


@dataclass(slots=True)
class DeleteGroupsResponse:
    results: list[DeletableGroupResult]


# --- OffsetDelete (api key 47) --------------------------------------------------------------------------------
@dataclass(slots=True)
class OffsetDeleteRequestTopic:
    name: str
    partition_indexes: list[int]


@dataclass(slots=True)
class OffsetDeleteRequest:
    group_id: str
    topics: list[OffsetDeleteRequestTopic]
    version: int = 0


@dataclass(slots=True)
class OffsetDeleteResponsePartition:
    partition_index: int
    error_code: Errors


@dataclass(slots=True)
class OffsetDeleteResponseTopic:
    name: str
    partitions: list[OffsetDeleteResponsePartition]


@dataclass(slots=True)
class OffsetDeleteResponse:
    error_code: Errors  # a group-level error leaves `topics` empty
    topics: list[OffsetDeleteResponseTopic] = field(default_factory=list)
