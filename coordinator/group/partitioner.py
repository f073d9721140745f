"""Group id → state-topic partition, exactly as Kafka maps a group to a `__consumer_offsets` partition. The
runtime routes every request with it (a group lives in the shard of its partition).

Kafka computes `Utils.abs(groupId.hashCode()) % numPartitions`. Python's `hash()` and `abs()` give different
answers, so both Java pieces are reproduced here:
- `String.hashCode` folds the UTF-16 code units (a character outside the BMP counts as two surrogate units)
  with `h = 31*h + unit` in signed 32-bit arithmetic;
- `Utils.abs` maps `Integer.MIN_VALUE` to 0, where `Math.abs` would leave it negative.
The partition count must never change after deployment: every group would move to another partition.
"""

from __future__ import annotations

import struct
from array import array

_INT32_MIN = -(1 << 31)
_UINT32_MASK = 0xFFFFFFFF


def java_string_hash(text: str) -> int:
    """Java's `String.hashCode()`: a signed 32-bit fold over the UTF-16 code units."""
    units = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for (unit,) in struct.iter_unpack(">H", units):
        h = (31 * h + unit) & _UINT32_MASK
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_abs(value: int) -> int:
    """Kafka's `Utils.abs`: like `Math.abs`, except `Integer.MIN_VALUE` becomes 0 instead of staying negative."""
    return 0 if value == _INT32_MIN else abs(value)


def partition_for(group_id: str, num_partitions: int) -> int:
    """The state-topic partition that holds `group_id`'s records (Kafka's `partitionFor`)."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    return kafka_abs(java_string_hash(group_id)) % num_partitions


class PartitionCache:
    """`partition_for` remembered for the group ids clients keep asking about, in bounded memory.

    Every request is routed by a group id a client sent: a cache that kept every id it was asked for would keep
    whatever a client invents (a fuzzer, a typo loop, one id per connection) until it is full, i.e. grow with the
    connections. An id is kept once it is seen a second time: a one-slot-per-hash doorkeeper of fixed size
    remembers the hash of the last id seen in each slot (no id itself), so ids seen once cost nothing after
    their request. Live groups' ids come back with every heartbeat and are kept; when `max_entries` are kept
    the cache starts over (O(1); live ids come back after two requests). Ids longer than `max_id_chars` are
    never kept."""

    __slots__ = ("num_partitions", "_partitions", "_seen", "_slot_mask", "_max_entries", "_max_id_chars")

    def __init__(self, num_partitions: int, *, max_entries: int = 1 << 17, doorkeeper_slots: int = 1 << 16,
                 max_id_chars: int = 255) -> None:
        if doorkeeper_slots & (doorkeeper_slots - 1):
            raise ValueError(f"doorkeeper_slots must be a power of two, got {doorkeeper_slots}")
        self.num_partitions = num_partitions
        self._partitions: dict[str, int] = {}
        self._seen = array("q", bytes(8 * doorkeeper_slots))  # the hash of the last id seen in each slot
        self._slot_mask = doorkeeper_slots - 1
        self._max_entries = max_entries
        self._max_id_chars = max_id_chars

    def __len__(self) -> int:
        return len(self._partitions)

    def partition(self, group_id: str) -> int:
        partition = self._partitions.get(group_id)
        if partition is not None:
            return partition
        partition = partition_for(group_id, self.num_partitions)
        if len(group_id) <= self._max_id_chars:
            id_hash = hash(group_id)
            slot = id_hash & self._slot_mask
            if self._seen[slot] == id_hash:
                if len(self._partitions) >= self._max_entries:
                    self._partitions.clear()
                self._partitions[group_id] = partition
            else:
                self._seen[slot] = id_hash
        return partition


_CACHES: dict[int, PartitionCache] = {}  # by partition count (one in a service; tests use several)


def cached_partition_for(group_id: str, num_partitions: int) -> int:
    """`partition_for` behind a bounded cache (PartitionCache): the runtime asks on every request (Heartbeat
    included), and the Java hash costs a Python loop over the id's characters."""
    cache = _CACHES.get(num_partitions)
    if cache is None:
        if num_partitions <= 0:
            raise ValueError(f"num_partitions must be positive, got {num_partitions}")
        cache = _CACHES[num_partitions] = PartitionCache(num_partitions)
    return cache.partition(group_id)
