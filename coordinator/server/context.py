"""What a handler sees besides the request itself: who is asking, which node we are, and the group service."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from coordinator.group import api
from coordinator.security.authorizer import ANONYMOUS, Authorizer, Operation, ResourceType
from protocol.error_codes import Errors

if TYPE_CHECKING:
    from coordinator.group.shard import GroupShard
    from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
    from coordinator.group.modern.service import DescribedGroup
    from coordinator.group.modern.steady import SteadyMember
    from coordinator.server.handlers.consumer_group_heartbeat import SteadyAnswers
    from coordinator.relay.relay import Relay


class GroupService(Protocol):
    """The GroupRuntime's request entry points (coordinator/group). JoinGroup and SyncGroup may park;
    Heartbeat is synchronous. A service may also offer `start_join_group`/`start_sync_group` (GroupRuntime's),
    which the connection then uses to serve those two without a coroutine."""

    async def join_group(self, request: api.JoinGroupRequest) -> api.JoinGroupResponse: ...
    async def sync_group(self, request: api.SyncGroupRequest) -> api.SyncGroupResponse: ...
    def handle_heartbeat(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None = None
    ) -> Errors: ...  # the synchronous hot path: an error code
    async def leave_group(self, request: api.LeaveGroupRequest) -> api.LeaveGroupResponse: ...
    async def commit_offsets(self, request: api.OffsetCommitRequest) -> api.OffsetCommitResponse: ...
    async def fetch_offsets(self, request: api.OffsetFetchRequest) -> api.OffsetFetchResponse: ...
    async def describe_groups(self, request: api.DescribeGroupsRequest) -> api.DescribeGroupsResponse: ...
    async def list_groups(self, request: api.ListGroupsRequest) -> api.ListGroupsResponse: ...
    async def delete_groups(self, request: api.DeleteGroupsRequest) -> api.DeleteGroupsResponse: ...
    async def delete_offsets(self, request: api.OffsetDeleteRequest) -> api.OffsetDeleteResponse: ...
    async def consumer_group_heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse: ...
    def start_consumer_group_heartbeat(  # the answer at once, or what to await for it (the connection's path)
        self, request: HeartbeatRequest) -> HeartbeatResponse | Awaitable[HeartbeatResponse]: ...
    def steady_consumer_group_heartbeat(  # a steady heartbeat's answer, or None: start_... serves it
        self, request: HeartbeatRequest) -> HeartbeatResponse | None: ...
    def steady_member(  # what the steady answer just given came from, to answer the member again (or None)
        self, group_id: str, member_id: str) -> SteadyMember | None: ...
    def steady_again(self, steady: SteadyMember) -> bool: ...  # answered as before (session moved), or False
    async def consumer_group_describe(self, group_ids: list[str]) -> list[DescribedGroup]: ...
    def state_partition(self, group_id: str) -> tuple[str, int] | None: ...  # (topic, partition) of the group
    def shard_for(self, group_id: str | None) -> GroupShard: ...  # the shard of the group's partition


@dataclass(frozen=True, slots=True)
class Node:
    """This coordinator as a Kafka broker node, as advertised to clients."""

    node_id: int
    host: str
    port: int
    cluster_id: str


class Directory(Protocol):
    """Where each group is coordinated when several instances share the state topic (coordinator/cluster).
    Without one (a single instance) this node coordinates every group and is the only one."""

    def coordinator_node(self, group_id: str) -> Node | None: ...  # None: unknown now (the partition is moving)
    def nodes(self) -> list[Node]: ...  # every live instance, this one included


@dataclass(slots=True)
class ConnectionContext:
    """One per connection; handlers get it with every request."""

    node: Node
    coordinator: GroupService
    client_host: str  # Java InetAddress.toString() form: "/127.0.0.1"
    peer: str  # "127.0.0.1:53122", for log lines
    relay: Relay | None = None  # the cluster behind us (None: --no-relay, the coordinator alone)
    directory: Directory | None = None  # the other instances (None: this one coordinates every group)
    principal: str = ANONYMOUS  # as Kafka's DefaultKafkaPrincipalBuilder names it (coordinator/security/principals)
    authorizer: Authorizer | None = None  # the cluster's ACLs (None, or not enforcing: everything is allowed)
    upstream_node: int | None = None  # the broker this connection's listener stands for (None: bootstrap)
    # the steady ConsumerGroupHeartbeats answered on this connection, to answer again (set at the first one)
    steady_answers: SteadyAnswers | None = None

    def allows(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        """KafkaApis' authHelper.authorize for this connection's principal and address."""
        authorizer = self.authorizer
        # not enforcing (a cluster without an authorizer): allowed without the call, as Authorizer.allows answers
        # (a JoinGroup and a SyncGroup of every member in a rebalance ask)
        return authorizer is None or not authorizer.enforcing or authorizer.allows(
            self.principal, self.client_host[1:], operation, resource_type, name)

    def describable_topics(self, names: Iterable[str]) -> frozenset[str]:
        """Of these topics, those this connection's principal may DESCRIBE now (GroupMetadataManager's
        filterTopicDescribeAuthorizedTopics: a filter, so a denial is not counted as a refusal)."""
        authorizer = self.authorizer
        if authorizer is None:
            return frozenset(names)
        host = self.client_host[1:]
        return frozenset(name for name in names if authorizer.allows(
            self.principal, host, Operation.DESCRIBE, ResourceType.TOPIC, name, audited=False))

    def group_operations(self, group_id: str) -> int:
        """DescribeGroups' authorized operations on a group (KIP-430), as AuthHelper.authorizedOperations."""
        if self.authorizer is None:
            return Authorizer().authorized_operations(self.principal, "", ResourceType.GROUP, group_id)
        return self.authorizer.authorized_operations(self.principal, self.client_host[1:], ResourceType.GROUP,
                                                     group_id)


def java_host_string(address: str) -> str:
    """Kafka reports a member's host as Java's `InetAddress.toString()`: "/" + the literal address, IPv6
    written out without zero compression ("/0:0:0:0:0:0:0:1")."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return "/" + address
    if ip.version == 6 and ip.ipv4_mapped is not None:  # a dual-stack socket: Java sees the IPv4 address
        return "/" + str(ip.ipv4_mapped)
    if ip.version == 6:
        return "/" + ":".join(f"{int(group, 16):x}" for group in ip.exploded.split(":"))
    return "/" + str(ip)
