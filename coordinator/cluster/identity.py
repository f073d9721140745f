"""An instance's identity and address, carried in the client.id of its membership consumer.

The instances form a consumer group on the state topic; DescribeGroups on that group lists every live member
with its client.id and assignment. Putting the instance's coordinator endpoint in the client.id makes that one
answer the whole owner map (partition -> instance -> host:port) without a registry of our own.

    client.id = "group-coordinator-instance|<instance id>|<node id>|<host>|<port>"
(Kafka accepts any string as a client id; it is only logged and quoted.)
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from coordinator.relay.config import DEFAULT_NODE_ID

CLIENT_ID_PREFIX = "group-coordinator-instance"
_SEPARATOR = "|"
_INSTANCE_ID = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
# Instances take node ids just above the single-instance default, far from any broker's.
_NODE_ID_SPAN = 1_000_000


@dataclass(frozen=True, slots=True)
class InstanceEndpoint:
    """One coordinator instance as clients see it: its node in Metadata/FindCoordinator."""

    instance_id: str
    node_id: int
    host: str
    port: int


def validate_instance_id(instance_id: str) -> str:
    if not _INSTANCE_ID.match(instance_id):
        raise ValueError(f"instance id {instance_id!r}: use 1-200 characters of A-Z a-z 0-9 . _ -")
    return instance_id


def default_node_id(instance_id: str) -> int:
    """A stable node id derived from the instance id (the same after a restart). Two instance ids may collide
    (1 in a million per pair): the owner map logs it; give one of them --node-id."""
    return DEFAULT_NODE_ID + 1 + zlib.crc32(instance_id.encode()) % _NODE_ID_SPAN


def client_id_for(endpoint: InstanceEndpoint) -> str:
    return _SEPARATOR.join((CLIENT_ID_PREFIX, endpoint.instance_id, str(endpoint.node_id), endpoint.host,
                            str(endpoint.port)))


def parse_client_id(client_id: str) -> InstanceEndpoint | None:
    """The endpoint a member's client.id carries; None for anything else (a foreign member of the group)."""
    parts = client_id.split(_SEPARATOR)
    if len(parts) != 5 or parts[0] != CLIENT_ID_PREFIX or not _INSTANCE_ID.match(parts[1]):
        return None
    try:
        node_id, port = int(parts[2]), int(parts[4])
    except ValueError:
        return None
    if not parts[3] or not 0 < port < 65536:
        return None
    return InstanceEndpoint(parts[1], node_id, parts[3], port)
