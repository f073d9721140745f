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
from functools import lru_cache

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


@lru_cache(maxsize=1 << 17)
def cached_partition_for(group_id: str, num_partitions: int) -> int:
    """`partition_for` behind a bounded cache: the runtime asks on every request (Heartbeat included), and
    the Java hash costs a Python loop over the id's characters."""
    return partition_for(group_id, num_partitions)
