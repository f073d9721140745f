"""Group-protocol requests of the simulated consumers, at the versions the coordinator offers (negotiated with
ApiVersions, like real clients), and the pre-encoded Heartbeat: the only request sent at a high rate.

kio builds every other request (JoinGroup, SyncGroup, OffsetCommit, LeaveGroup are rare); a Heartbeat frame is
packed once per generation and only its correlation id is patched per send (~0.3 µs instead of kio's ~7 µs).
"""

from __future__ import annotations

import datetime
import struct
from typing import Any

from protocol import apis
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.fastpath import pack_heartbeat_request
from protocol.messages import build, item_class

# the newest version of each API the simulator speaks (capped by what the server offers)
HIGHEST = {ApiKey.FIND_COORDINATOR: 3, ApiKey.JOIN_GROUP: 9, ApiKey.SYNC_GROUP: 5, ApiKey.HEARTBEAT: 4,
           ApiKey.LEAVE_GROUP: 5, ApiKey.OFFSET_COMMIT: 8}
API_NAMES = {ApiKey.FIND_COORDINATOR: "FindCoordinator", ApiKey.JOIN_GROUP: "JoinGroup",
             ApiKey.SYNC_GROUP: "SyncGroup", ApiKey.HEARTBEAT: "Heartbeat", ApiKey.LEAVE_GROUP: "LeaveGroup",
             ApiKey.OFFSET_COMMIT: "OffsetCommit"}
_CORRELATION_OFFSET = 8  # size int32, api_key int16, api_version int16, then correlation_id int32
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")


def _ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


def request(client: KafkaClient, api_key: ApiKey, **fields: Any) -> Any:
    version = client.version_for(api_key, HIGHEST[api_key])
    return build(apis.request_class(api_key, version), **fields)


def find_coordinator(client: KafkaClient, group_id: str) -> Any:
    return request(client, ApiKey.FIND_COORDINATOR, key=group_id, key_type=0)


def join_group(client: KafkaClient, group_id: str, member_id: str, instance_id: str | None, session_ms: int,
               rebalance_ms: int, protocol_name: str, metadata: bytes, reason: str | None) -> Any:
    version = client.version_for(ApiKey.JOIN_GROUP, HIGHEST[ApiKey.JOIN_GROUP])
    cls = apis.request_class(ApiKey.JOIN_GROUP, version)
    protocol = item_class(cls, "protocols")(name=protocol_name, metadata=metadata)
    return build(cls, group_id=group_id, session_timeout=_ms(session_ms), rebalance_timeout=_ms(rebalance_ms),
                 member_id=member_id, group_instance_id=instance_id, protocol_type="consumer",
                 protocols=(protocol,), reason=reason)


def sync_group(client: KafkaClient, group_id: str, generation: int, member_id: str, instance_id: str | None,
               protocol_name: str, assignments: dict[str, bytes]) -> Any:
    version = client.version_for(ApiKey.SYNC_GROUP, HIGHEST[ApiKey.SYNC_GROUP])
    cls = apis.request_class(ApiKey.SYNC_GROUP, version)
    entry = item_class(cls, "assignments")
    return build(cls, group_id=group_id, generation_id=generation, member_id=member_id,
                 group_instance_id=instance_id, protocol_type="consumer", protocol_name=protocol_name,
                 assignments=tuple(entry(member_id=m, assignment=a) for m, a in assignments.items()))


def leave_group(client: KafkaClient, group_id: str, member_id: str, instance_id: str | None) -> Any:
    version = client.version_for(ApiKey.LEAVE_GROUP, HIGHEST[ApiKey.LEAVE_GROUP])
    cls = apis.request_class(ApiKey.LEAVE_GROUP, version)
    if version < 3:
        return build(cls, group_id=group_id, member_id=member_id)
    member = item_class(cls, "members")(member_id=member_id, group_instance_id=instance_id,
                                        reason="simulated consumer leaving")
    return build(cls, group_id=group_id, members=(member,))


def leave_errors(response: Any) -> list[int]:
    codes = [int(response.error_code)]
    codes.extend(int(m.error_code) for m in getattr(response, "members", ()))
    return codes


def offset_commit(client: KafkaClient, group_id: str, generation: int, member_id: str, instance_id: str | None,
                  offsets: dict[tuple[str, int], int]) -> Any:
    version = client.version_for(ApiKey.OFFSET_COMMIT, HIGHEST[ApiKey.OFFSET_COMMIT])
    cls = apis.request_class(ApiKey.OFFSET_COMMIT, version)
    topic_cls = item_class(cls, "topics")
    partition_cls = item_class(topic_cls, "partitions")
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append(build(partition_cls, partition_index=partition,
                                                    committed_offset=offset, committed_leader_epoch=-1,
                                                    committed_metadata="simulated"))
    topics = tuple(topic_cls(name=t, partitions=tuple(ps)) for t, ps in by_topic.items())
    return build(cls, group_id=group_id, generation_id_or_member_epoch=generation, member_id=member_id,
                 group_instance_id=instance_id, retention_time_ms=-1, topics=topics)


class HeartbeatFrame:
    """A Heartbeat request packed once for (group, generation, member); `send` patches the correlation id."""

    __slots__ = ("frame", "version", "_error_offset")

    def __init__(self, client: KafkaClient, group_id: str, generation: int, member_id: str,
                 instance_id: str | None) -> None:
        self.version = client.version_for(ApiKey.HEARTBEAT, HIGHEST[ApiKey.HEARTBEAT])
        packed = pack_heartbeat_request(self.version, 0, client.client_id, group_id, generation, member_id,
                                        instance_id if self.version >= 3 else None)
        self.frame = bytearray(packed)
        # response: correlation id, (v4: header tags, 1 byte), (v1+: throttle_time_ms), error_code
        self._error_offset = 4 + (1 if self.version >= 4 else 0) + (4 if self.version >= 1 else 0)

    def send(self, client: KafkaClient, timeout_ms: int) -> Any:
        correlation_id = client.next_correlation_id()
        _INT32.pack_into(self.frame, _CORRELATION_OFFSET, correlation_id)
        return client.send_raw(bytes(self.frame), correlation_id, ApiKey.HEARTBEAT, self.version,
                               timeout_ms=timeout_ms)

    def error_code(self, response_frame: bytes) -> int:
        return _INT16.unpack_from(response_frame, self._error_offset)[0]
