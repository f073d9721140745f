"""The consumer protocol: what a consumer puts in JoinGroup protocol metadata (its Subscription) and what the
leader sends back through SyncGroup (each member's Assignment). The coordinator treats both as opaque bytes;
this codec is for clients, tests and the load generator.

Wire shape: int16 version, then the kio `ConsumerProtocolSubscription`/`ConsumerProtocolAssignment` body of that
version (non-flexible). Like Kafka's ConsumerProtocol, a version newer than ours is read with our newest schema
(newer versions only append fields), and a negative version is an error.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_entity_schema
from kio.serial import entity_writer
from kio.serial.errors import SerialError
from kio.static.constants import EntityType
from kio.static.protocol import Entity

from protocol.tolerant import read_entity

LATEST_VERSION = 3
_VERSION = struct.Struct(">h")

TopicPartitions = tuple[tuple[str, tuple[int, ...]], ...]


class ConsumerProtocolError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Subscription:
    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: TopicPartitions = ()  # v1+
    generation_id: int = -1  # v2+
    rack_id: str | None = None  # v3+


@dataclass(frozen=True, slots=True)
class Assignment:
    partitions: TopicPartitions
    user_data: bytes | None = None


@cache
def _schema(name: str, version: int) -> type:  # built by keyword (see _nested_class)
    return load_entity_schema(name, version, EntityType.data)


def _topic_partition_class(schema: type[Entity]) -> type:
    return _nested_class(schema, "TopicPartition")


def _nested_class(schema: type[Entity], name: str) -> type:
    """A class beside `schema` in its kio module, built by keyword (kio's Entity protocol has no constructor)."""
    module = __import__(schema.__module__, fromlist=[name])
    nested: type = getattr(module, name)
    return nested


def encode_subscription(subscription: Subscription, version: int = LATEST_VERSION) -> bytes:
    schema = _schema("consumer_protocol_subscription", version)
    fields: dict[str, Any] = {"topics": subscription.topics, "user_data": subscription.user_data}
    if version >= 1:
        fields["owned_partitions"] = _to_kio_partitions(schema, subscription.owned_partitions)
    if version >= 2:
        fields["generation_id"] = subscription.generation_id
    if version >= 3:
        fields["rack_id"] = subscription.rack_id
    return _encode(version, schema(**fields))


def decode_subscription(data: bytes) -> tuple[int, Subscription]:
    """(version as sent, Subscription)."""
    version, body = _decode("consumer_protocol_subscription", data)
    return version, Subscription(
        topics=tuple(body.topics),
        user_data=body.user_data,
        owned_partitions=_from_kio_partitions(getattr(body, "owned_partitions", ())),
        generation_id=int(getattr(body, "generation_id", -1)),
        rack_id=getattr(body, "rack_id", None),
    )


def encode_assignment(assignment: Assignment, version: int = LATEST_VERSION) -> bytes:
    schema = _schema("consumer_protocol_assignment", version)
    partitions = _to_kio_partitions(schema, assignment.partitions)
    return _encode(version, schema(assigned_partitions=partitions, user_data=assignment.user_data))


def decode_assignment(data: bytes) -> tuple[int, Assignment]:
    version, body = _decode("consumer_protocol_assignment", data)
    return version, Assignment(_from_kio_partitions(body.assigned_partitions), body.user_data)


# Any below: the kio entities of the consumer protocol, one dataclass per version, read and built field by field.
def _encode(version: int, body: Any) -> bytes:
    buffer = io.BytesIO()
    buffer.write(_VERSION.pack(version))
    entity_writer(type(body))(buffer, body)
    return buffer.getvalue()


def _decode(name: str, data: bytes) -> tuple[int, Any]:
    if len(data) < _VERSION.size:
        raise ConsumerProtocolError(f"{name}: {len(data)} bytes is too short for a version")
    (version,) = _VERSION.unpack_from(data)
    if version < 0:
        raise ConsumerProtocolError(f"{name}: negative version {version}")
    schema = _schema(name, min(version, LATEST_VERSION))
    try:
        body, size = read_entity(schema, data, _VERSION.size)  # checks array lengths before allocating
    except (SerialError, KeyError, ValueError, OverflowError, TypeError) as exc:
        raise ConsumerProtocolError(f"{name} v{version}: {exc!r}") from exc
    if version <= LATEST_VERSION and _VERSION.size + size != len(data):
        raise ConsumerProtocolError(f"{name} v{version}: trailing bytes")
    return version, body


def _to_kio_partitions(schema: type[Entity], partitions: TopicPartitions) -> tuple[Any, ...]:
    topic_partition = _topic_partition_class(schema)
    return tuple(topic_partition(topic=topic, partitions=tuple(ids)) for topic, ids in partitions)


def _from_kio_partitions(partitions: Any) -> TopicPartitions:
    return tuple((tp.topic, tuple(int(p) for p in tp.partitions)) for tp in partitions)
