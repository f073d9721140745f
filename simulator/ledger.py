"""What the state store was told about every write: issued (with its records), landed in the log, and how it
ended (acked, a Kafka error, timed out, or lost with its process). The checkers judge the coordinator against
this record of *what it was told*, not against the log: a write reported failed by Kafka may still be in the log
(a timeout, NOT_ENOUGH_REPLICAS_AFTER_APPEND), and the coordinator cannot know that.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Sequence

from coordinator.storage.records import (GroupMetadataKey, OffsetCommitKey, decode_group_metadata_value,
                                        decode_key)
from coordinator.group.modern.records import Tombstone
from coordinator.group.records import GroupRecord
from coordinator.storage import consumer_records
from simulator.history import History

# Outcomes after which the write is known not to be in the log (Kafka said it failed before appending).
REFUSED = frozenset({"NOT_ENOUGH_REPLICAS"})
# A transactional write ("txn:<error>") that failed is never visible, unless its commit's outcome is unknown.
TXN_UNKNOWN = frozenset({"txn:_TIMED_OUT", "txn:_MSG_TIMED_OUT"})
PENDING = "pending"
_OFFSET = struct.Struct(">q")
ACKED = "acked"

# (group, topic, partition) for an offset, (group,) for a classic group record, (group, CONSUMER, record type,
# member id or regular expression or "") for a consumer group's record (types 3-8 and 16)
Key = tuple[str, str, int] | tuple[str] | tuple[str, str, int, str]
CONSUMER = "consumer"


@dataclass(eq=False)
class Write:
    write_id: int
    producer: str
    partition: int
    keys: list[tuple[Key, bytes | None]]  # decoded key, raw value (None: tombstone)
    offsets: dict[Key, int] = field(default_factory=dict)  # the committed offset of each offset key written
    status: str = PENDING
    landed_offsets: list[int] = field(default_factory=list)

    @property
    def may_be_in_log(self) -> bool:
        if self.status.startswith("txn:"):
            return self.status in TXN_UNKNOWN
        return self.status not in REFUSED


class Ledger:
    def __init__(self, history: History) -> None:
        self.history = history
        self.writes: list[Write] = []
        self.by_key: dict[Key, list[Write]] = {}
        self._keys: dict[bytes, Key | None] = {}

    def issued(self, producer: str, partition: int, records: Sequence[tuple[int, bytes, bytes | None]]) -> int:
        keys: list[tuple[Key, bytes | None]] = []
        offsets: dict[Key, int] = {}
        for _, key_bytes, value in records:
            key = self._key(key_bytes)
            if key is None:
                continue
            keys.append((key, value))
            if value is not None and len(key) == 3:
                offsets[key] = _committed_offset(value)
        write = Write(len(self.writes), producer, partition, keys, offsets=offsets)
        self.writes.append(write)
        for key, _ in keys:
            self.by_key.setdefault(key, []).append(write)
        self.history.record("write", id=write.write_id, producer=producer, partition=partition,
                            keys=tuple((k, v is None) for k, v in keys))
        return write.write_id

    def _key(self, key_bytes: bytes) -> Key | None:
        """The decoded key (a run writes the same few keys over and over: decoded once each)."""
        try:
            return self._keys[key_bytes]
        except KeyError:
            pass
        decoded = decode_key(key_bytes)
        key: Key | None = None
        if isinstance(decoded, OffsetCommitKey):
            key = (decoded.group, decoded.topic, decoded.partition)
        elif isinstance(decoded, GroupMetadataKey):
            key = (decoded.group,)
        elif decoded.version in consumer_records.CONSUMER_GROUP_TYPES:
            record = consumer_records.decode(key_bytes, None)  # its tombstone: the key's parts
            if isinstance(record, Tombstone):
                key = (record.group_id, CONSUMER, int(record.record_type), record.member_id or record.regex or "")
        self._keys[key_bytes] = key
        return key

    def landed(self, write_id: int, offsets: list[int]) -> None:
        self.writes[write_id].landed_offsets = offsets
        self.history.record("landed", id=write_id, offsets=(offsets[0], offsets[-1]) if offsets else ())

    def outcome(self, write_id: int, status: str) -> None:
        write = self.writes[write_id]
        write.status = status
        self.history.record("write_done", id=write_id, status=status)

    def crashed(self, producer: str) -> None:
        """The producer's process died: its writes nobody answered end unknown (they landed or not)."""
        for write in self.writes:
            if write.producer == producer and write.status == PENDING:
                self.outcome(write.write_id, "crashed")

    def value_of(self, write: Write, key: Key) -> bytes | None:
        """The key's value the write leaves in the log: its last record of the key (a conversion writes a consumer
        group's epoch record twice, the group's then the joining member's)."""
        for k, value in reversed(write.keys):
            if k == key:
                return value
        raise KeyError(key)

    def candidates(self, key: Key, reader: str | None = None, loaded_before: int = 0
                   ) -> tuple[list[bytes | None], bool]:
        """The values a read of `key` may show, given what the coordinator was told: the last acknowledged one
        (or nothing, if none was) and every later one that may have landed. Second: whether an acknowledged one
        exists. With `reader` (a producer name): what that process's memory may hold — the writes of other
        producers issued after its last load of the partition (ids from `loaded_before`) are not ones it can
        know (another instance took the partition over while it was paused: a zombie's memory is as of then)."""
        values: list[bytes | None] = []
        for write in reversed(self.by_key.get(key, [])):
            if reader is not None and write.producer != reader and write.write_id >= loaded_before:
                continue
            if write.status == ACKED:
                values.append(self.value_of(write, key))
                return values, True
            if write.may_be_in_log:
                values.append(self.value_of(write, key))
        values.append(None)
        return values, False

    def acked_write_of_offset(self, key: Key, offset: int) -> Write | None:
        """The acknowledged write that committed `offset` for `key`, if any."""
        for write in reversed(self.by_key.get(key, [])):
            if write.status == ACKED and write.offsets.get(key) == offset:
                return write
        return None

    def tombstoned_after(self, key: Key, write_id: int) -> bool:
        """Whether a tombstone of `key` was issued after write `write_id` (so its value may be gone)."""
        for write in reversed(self.by_key.get(key, [])):
            if write.write_id <= write_id:
                return False
            if self.value_of(write, key) is None:
                return True
        return False

    def last_tombstone(self, key: Key, since: int, until: int) -> int:
        """The id of the latest tombstone of `key` among the writes `since` to `until`, else `until`."""
        for write in reversed(self.by_key.get(key, [])):
            if write.write_id < since:
                break
            if write.write_id <= until and self.value_of(write, key) is None:
                return write.write_id
        return until

    def written_after(self, key: Key, write_id: int) -> bool:
        """Whether a value (not a tombstone) of `key` was issued after write `write_id`."""
        for write in reversed(self.by_key.get(key, [])):
            if write.write_id <= write_id:
                return False
            if self.value_of(write, key) is not None:
                return True
        return False

    def group_generation_stored(self, group_id: str, generation: int, reader: str,
                                loaded_before: int = 0) -> bool:
        """Whether `reader` (a producer name) can know the group record of `generation`: it was acknowledged,
        or it may be in the log and was written by another producer or before the reader's last load of its
        partition (writes with ids below `loaded_before`), so a load may have found it."""
        for write in reversed(self.by_key.get((group_id,), [])):
            value = self.value_of(write, (group_id,))
            if value is None or decode_group(value).generation != generation:
                continue
            if write.status == ACKED or (write.may_be_in_log and (write.producer != reader
                                                                  or write.write_id < loaded_before)):
                return True
        return False


def _committed_offset(value: bytes) -> int:
    """The committed offset of an offset commit value: every version starts with its version (int16) and the
    offset (int64)."""
    offset: int = _OFFSET.unpack_from(value, 2)[0]
    return offset


def decode_group(value: bytes) -> GroupRecord:
    return decode_group_metadata_value(value)
