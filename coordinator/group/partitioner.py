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
import time
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
    """`partition_for` remembered for the group ids clients keep coming back to, in bounded memory.

    Every request is routed by a group id a client sent: a cache that kept every id it was asked for would keep
    whatever a client invents (a fuzzer, a typo loop, one id per connection) until it is full, i.e. grow with the
    connections. An id is kept once it is asked about again at least `recurrence_s` after it was first seen: a
    fixed-size doorkeeper remembers, per slot of the id's hash, the last id's hash and when it was first seen (no
    id itself), so ids that come once (or in one burst, as a connection's batch of requests) cost nothing after
    their requests. Live groups' ids come back with every heartbeat and are kept. When `max_entries` are kept
    the cache starts over (O(1); live ids come back). Ids longer than `max_id_chars` are never kept.

    `kept` (group id -> partition) is the cache itself, emptied in place and never replaced: a caller on the
    hottest path (the runtime's heartbeat) reads it directly and asks `partition` only for an id not in it."""

    __slots__ = ("num_partitions", "kept", "_seen_hash", "_seen_at", "_slot_mask", "_recurrence_s",
                 "_max_entries", "_max_id_chars")

    def __init__(self, num_partitions: int, *, max_entries: int = 1 << 17, doorkeeper_slots: int = 1 << 16,
                 recurrence_s: int = 1, max_id_chars: int = 255) -> None:
        if doorkeeper_slots & (doorkeeper_slots - 1):
            raise ValueError(f"doorkeeper_slots must be a power of two, got {doorkeeper_slots}")
        self.num_partitions = num_partitions
        self.kept: dict[str, int] = {}
        self._seen_hash = array("q", bytes(8 * doorkeeper_slots))  # the last id seen in each slot, by hash
        self._seen_at = array("Q", bytes(8 * doorkeeper_slots))  # when it was first seen (whole seconds)
        self._slot_mask = doorkeeper_slots - 1
        self._recurrence_s = recurrence_s
        self._max_entries = max_entries
        self._max_id_chars = max_id_chars

    def __len__(self) -> int:
        return len(self.kept)

    def partition(self, group_id: str) -> int:
        partition = self.kept.get(group_id)
        if partition is not None:
            return partition
        partition = partition_for(group_id, self.num_partitions)
        if len(group_id) <= self._max_id_chars:
            self._count_sighting(group_id, partition)
        return partition

    def _count_sighting(self, group_id: str, partition: int) -> None:
        id_hash = hash(group_id)
        slot = id_hash & self._slot_mask
        now_s = int(time.monotonic())
        if self._seen_hash[slot] != id_hash:
            self._seen_hash[slot] = id_hash
            self._seen_at[slot] = now_s
        elif now_s - self._seen_at[slot] >= self._recurrence_s:
            kept = self.kept
            if len(kept) >= self._max_entries:
                kept.clear()  # in place: readers of `kept` hold this dict
            kept[group_id] = partition


_CACHES: dict[int, PartitionCache] = {}  # by partition count (one in a service; tests use several)


def partition_cache(num_partitions: int) -> PartitionCache:
    """The process's PartitionCache for `num_partitions` (the runtime holds it: one lookup per request)."""
    cache = _CACHES.get(num_partitions)
    if cache is None:
        if num_partitions <= 0:
            raise ValueError(f"num_partitions must be positive, got {num_partitions}")
        cache = _CACHES[num_partitions] = PartitionCache(num_partitions)
    return cache


def cached_partition_for(group_id: str, num_partitions: int) -> int:
    """`partition_for` behind a bounded cache (PartitionCache): the runtime asks on every request (Heartbeat
    included), and the Java hash costs a Python loop over the id's characters."""
    return partition_cache(num_partitions).partition(group_id)
