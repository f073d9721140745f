"""The owner map as the server sees it: group id → the node that coordinates it, and every live instance's node
(the Directory protocol of coordinator/server/context.py)."""

from __future__ import annotations

from typing import Protocol

from coordinator.cluster.identity import InstanceEndpoint
from coordinator.group.partitioner import cached_partition_for
from coordinator.server.context import Node


class Owners(Protocol):
    """What the directory reads from coordinator/cluster/owner_map.py: OwnerMap."""

    def owner(self, partition: int) -> InstanceEndpoint | None: ...
    def instances(self) -> list[InstanceEndpoint]: ...


class OwnerMapDirectory:
    """Routes a group to the owner of its state-topic partition (Kafka's partitionFor, as the runtime routes it).

    The server needs its directory when it is made, the owner map needs our endpoint, whose port is known only
    once the listener is open: so the map may be attached later. Until then no owner is known
    (COORDINATOR_NOT_AVAILABLE: clients retry) and Metadata lists this node alone."""

    def __init__(self, num_partitions: int, cluster_id: str, owners: Owners | None = None) -> None:
        self._owners = owners
        self._num_partitions = num_partitions
        self._cluster_id = cluster_id
        self._nodes: dict[InstanceEndpoint, Node] = {}  # one Node per endpoint, not one per request

    def attach(self, owners: Owners) -> None:
        self._owners = owners

    def coordinator_node(self, group_id: str) -> Node | None:
        if self._owners is None:
            return None
        endpoint = self._owners.owner(cached_partition_for(group_id, self._num_partitions))
        return None if endpoint is None else self._node(endpoint)

    def nodes(self) -> list[Node]:
        if self._owners is None:
            return []
        return [self._node(endpoint) for endpoint in self._owners.instances()]

    def _node(self, endpoint: InstanceEndpoint) -> Node:
        node = self._nodes.get(endpoint)
        if node is None:
            if len(self._nodes) > 10_000:  # instances come and go (new ports after restarts): stay bounded
                self._nodes.clear()
            node = self._nodes[endpoint] = Node(endpoint.node_id, endpoint.host, endpoint.port, self._cluster_id)
        return node
