"""Which APIs the relay advertises, and how each request is routed.

Three routes (docs/relay.md has the table with the reasons):
- LOCAL: every API the server's handlers serve (coordinator/server/handlers, passed in as `served`) except the
  rewritten ones: the group APIs (TxnOffsetCommit too: the offsets go to our state partition) and ApiVersions,
  at our own ranges. They never reach the upstream cluster, whose
  own group coordinator must not see our groups.
- REWRITTEN: Metadata and FindCoordinator, answered here from an upstream answer whose broker addresses are
  replaced by ours (so their ranges are also capped by what the upstream broker serves); AddOffsetsToTxn, served as the
  transaction coordinator serves it, an AddPartitionsToTxn of the partition holding the group's offsets: ours,
  the group's state partition, sent to the transaction coordinator (server/handlers/add_offsets_to_txn.py).
- RELAYED: every other API in `RELAYED_MAX` goes to the upstream broker byte for byte, at the intersection of
  the broker's range and our cap. A cap sits below the first version whose response carries broker addresses
  we would have to rewrite (KIP-951's NodeEndpoints in Fetch v16+, DescribeQuorum v2's nodes); Produce v10+
  answers are relayed through coordinator/relay/produce_endpoints.py, which rewrites theirs.

Anything else is not advertised: the share-group APIs (76-79), DescribeCluster (60, its
broker list would need rewriting; Admin clients fall back to Metadata), SASL and delegation tokens (17, 36,
38-41: an authenticated upstream link would not authenticate the group APIs served here; on SASL listeners the
relay adds 17 and 36, passed through with Kafka's sequence kept, coordinator/security/sasl_passthrough.py), and APIs newer
than this table (they might carry addresses). A request for an API or version not advertised closes the
connection, as Kafka does.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from protocol.apis import ApiKey


class Route(enum.Enum):
    LOCAL = "local"
    REWRITTEN = "rewritten"
    RELAYED = "relayed"


REWRITTEN_KEYS = frozenset((int(ApiKey.METADATA), int(ApiKey.FIND_COORDINATOR), int(ApiKey.ADD_OFFSETS_TO_TXN)))


def local_keys(served: Collection[int]) -> frozenset[int]:
    """The APIs answered here at our own ranges, given the api keys the server's handlers serve."""
    return frozenset(int(key) for key in served) - REWRITTEN_KEYS


_UNCAPPED = 32_767
# api key -> highest version relayed byte for byte (the broker's own maximum applies below it)
RELAYED_MAX: dict[int, int] = {
    0: _UNCAPPED,  # Produce: v10+ NodeEndpoints rewritten (produce_endpoints.py); v12 is transaction version 2
    1: 15,  # Fetch: v16+ responses carry NodeEndpoints (KIP-951)
    2: _UNCAPPED,  # ListOffsets
    19: _UNCAPPED,  # CreateTopics
    20: _UNCAPPED,  # DeleteTopics
    21: _UNCAPPED,  # DeleteRecords
    22: _UNCAPPED,  # InitProducerId
    23: _UNCAPPED,  # OffsetForLeaderEpoch
    24: _UNCAPPED,  # AddPartitionsToTxn
    26: _UNCAPPED,  # EndTxn
    29: _UNCAPPED,  # DescribeAcls
    30: _UNCAPPED,  # CreateAcls
    31: _UNCAPPED,  # DeleteAcls
    32: _UNCAPPED,  # DescribeConfigs
    33: _UNCAPPED,  # AlterConfigs
    34: _UNCAPPED,  # AlterReplicaLogDirs
    35: _UNCAPPED,  # DescribeLogDirs
    37: _UNCAPPED,  # CreatePartitions
    43: _UNCAPPED,  # ElectLeaders
    44: _UNCAPPED,  # IncrementalAlterConfigs
    45: _UNCAPPED,  # AlterPartitionReassignments
    46: _UNCAPPED,  # ListPartitionReassignments
    48: _UNCAPPED,  # DescribeClientQuotas
    49: _UNCAPPED,  # AlterClientQuotas
    50: _UNCAPPED,  # DescribeUserScramCredentials
    51: _UNCAPPED,  # AlterUserScramCredentials
    55: 1,  # DescribeQuorum: v2 responses carry the controllers' endpoints
    57: _UNCAPPED,  # UpdateFeatures
    61: _UNCAPPED,  # DescribeProducers
    64: _UNCAPPED,  # UnregisterBroker
    65: _UNCAPPED,  # DescribeTransactions
    66: _UNCAPPED,  # ListTransactions
    71: _UNCAPPED,  # GetTelemetrySubscriptions
    72: _UNCAPPED,  # PushTelemetry
    74: _UNCAPPED,  # ListClientMetricsResources
    75: _UNCAPPED,  # DescribeTopicPartitions
}


def advertised_ranges(upstream: Mapping[int, tuple[int, int]],
                      served: Mapping[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """api key -> (min, max) we advertise, given the upstream broker's ranges and the ranges served here."""
    table: dict[int, tuple[int, int]] = {}
    for key in local_keys(served):
        table[key] = served[key]
    for key in REWRITTEN_KEYS:
        merged = _intersect(served[key], upstream.get(key))
        if merged is not None:
            table[key] = merged
    for key, cap in RELAYED_MAX.items():
        merged = _intersect((0, cap), upstream.get(key))
        if merged is not None:
            table[key] = merged
    return dict(sorted(table.items()))


def _intersect(ours: tuple[int, int], theirs: tuple[int, int] | None) -> tuple[int, int] | None:
    if theirs is None:
        return None
    low, high = max(ours[0], theirs[0]), min(ours[1], theirs[1])
    return (low, high) if low <= high else None


_LOCAL, _REWRITTEN, _RELAYED = Route.LOCAL, Route.REWRITTEN, Route.RELAYED  # globals: every request asks


def route_of(api_key: int, local: frozenset[int]) -> Route:
    """`local`: local_keys() of what the server serves."""
    if api_key in local:
        return _LOCAL
    if api_key in REWRITTEN_KEYS:
        return _REWRITTEN
    return _RELAYED


def produce_expects_response(frame: bytes | memoryview, offset: int = 4) -> bool:
    """False for a Produce request with acks=0 (the broker sends no response); `frame` includes the size prefix.

    Layout after the request header prefix (api_key, api_version, correlation_id, client_id int16 string, v9+
    a tagged-field section): v3+ transactional_id (nullable string, compact in v9+), then acks int16.
    """
    version = int.from_bytes(frame[offset + 2 : offset + 4], "big", signed=True)
    position = offset + 8
    client_id_length = int.from_bytes(frame[position : position + 2], "big", signed=True)
    position += 2 + max(client_id_length, 0)
    flexible = version >= 9
    if flexible:
        position = _skip_tags(frame, position)
    if version >= 3:
        if flexible:
            length, position = uvarint(frame, position)
            position += max(length - 1, 0)
        else:
            length = int.from_bytes(frame[position : position + 2], "big", signed=True)
            position += 2 + max(length, 0)
    acks = int.from_bytes(frame[position : position + 2], "big", signed=True)
    return acks != 0


def uvarint(frame: bytes | memoryview, position: int) -> tuple[int, int]:
    """An unsigned varint at `position`: (value, the position after it); ValueError past the frame."""
    value = shift = 0
    while True:
        if position >= len(frame) or shift > 28:
            raise ValueError("truncated varint")
        byte = frame[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


def _skip_tags(frame: bytes | memoryview, position: int) -> int:
    count, position = uvarint(frame, position)
    for _ in range(count):
        _tag, position = uvarint(frame, position)
        length, position = uvarint(frame, position)
        position += length
    return position


@dataclass(frozen=True)
class ClusterFeatures:
    """The cluster's feature flags as its brokers answer ApiVersions v4 (KIP-584): clients decide on them, e.g.
    Kafka 4's producers run transaction version 2 when `transaction.version` is finalized at 2 or more."""

    supported: tuple[tuple[str, int, int], ...] = ()  # (name, min version, max version)
    epoch: int = -1  # -1: unknown, clients ignore the finalized list
    finalized: tuple[tuple[str, int, int], ...] = ()  # (name, max level, min level)

    @classmethod
    def of(cls, api_versions_response: Any) -> ClusterFeatures:
        return cls(tuple((str(f.name), int(f.min_version), int(f.max_version))
                         for f in api_versions_response.supported_features),
                   int(api_versions_response.finalized_features_epoch),
                   tuple((str(f.name), int(f.max_version_level), int(f.min_version_level))
                         for f in api_versions_response.finalized_features))

    def supported_for(self, api_versions_version: int) -> tuple[tuple[str, int, int], ...]:
        """ApiVersions v3 leaves out the features whose minimum version is 0 (Kafka's answer, KAFKA-17011)."""
        if api_versions_version >= 4:
            return self.supported
        return tuple(feature for feature in self.supported if feature[1] > 0)
