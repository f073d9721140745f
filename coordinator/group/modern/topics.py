"""The consumer group logic's digest of the topics it is subscribed to (the topics themselves: coordinator/topics.py),
and the group epoch bump that records it.

The digest is Kafka 4.1's (Utils.computeTopicHash, Utils.computeGroupHash), so Kafka loading our records sees the
hash it computes itself: XXH3-64 (seed 0) over the bytes hash4j's HashStream feeds it, where putLong and putInt are
little-endian and putString is the string's UTF-16 code units (little-endian) followed by its length in code units."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable

import xxhash

from coordinator.group.modern.records import GroupEpochRecord
from coordinator.topics import TopicImage, TopicsView

log = logging.getLogger("coordinator.group")

_TOPIC_HASH_MAGIC_BYTE = b"\x00"  # Utils.TOPIC_HASH_MAGIC_BYTE: the layout's version
_INT = struct.Struct("<i")
_TWO_LONGS = struct.Struct("<QQ")
_LOW_64 = (1 << 64) - 1
# topic hashes by image identity: the topic views hand out the same image until the topic changes
_TOPIC_HASHES: dict[int, tuple[TopicImage, int]] = {}
_TOPIC_HASHES_KEPT = 4_096


def metadata_hash(names: Iterable[str], topics: TopicsView) -> int:
    """Kafka's group metadata hash (ModernGroup.computeMetadataHash) of the subscribed topics that exist: 0 for none,
    else XXH3-64 over each one's topic hash (putLong), topics ordered by name."""
    images = sorted((t for t in (topics.by_name(n) for n in set(names)) if t is not None), key=lambda t: t.name)
    if not images:
        return 0
    return _signed(xxhash.xxh3_64_intdigest(struct.pack(f"<{len(images)}q", *map(topic_hash, images))))


def topic_hash(image: TopicImage) -> int:
    """Kafka's Utils.computeTopicHash: magic byte, topic id (most, then least significant long), name, partition
    count, then for each partition its index and its replicas' racks, sorted, each as its length and the string."""
    known = _TOPIC_HASHES.get(id(image))
    if known is not None and known[0] is image:
        return known[1]
    parts = [_TOPIC_HASH_MAGIC_BYTE, _TWO_LONGS.pack(image.topic_id.int >> 64, image.topic_id.int & _LOW_64),
             _hash4j_string(image.name), _INT.pack(image.partitions)]
    for partition in range(image.partitions):
        parts.append(_INT.pack(partition))
        for rack in sorted(image.partition_racks(partition), key=_java_string_order):
            encoded = _hash4j_string(rack)
            parts.append(encoded[-4:])  # String.length(), then putString (which ends with the same length)
            parts.append(encoded)
    value = _signed(xxhash.xxh3_64_intdigest(b"".join(parts)))
    if len(_TOPIC_HASHES) >= _TOPIC_HASHES_KEPT:
        _TOPIC_HASHES.clear()
    _TOPIC_HASHES[id(image)] = (image, value)
    return value


def _hash4j_string(text: str) -> bytes:
    units = text.encode("utf-16-le", "surrogatepass")
    return units + _INT.pack(len(units) // 2)


def _java_string_order(text: str) -> bytes:
    """String.compareTo's order (UTF-16 code units), which differs from code point order above U+FFFF."""
    return text.encode("utf-16-be", "surrogatepass")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def bumped_group_epoch(group_id: str, epoch: int, new_hash: int) -> GroupEpochRecord:
    """A bump as a member's request or a regular expression's resolution makes it, with Kafka 4.1's line."""
    log.info("[GroupId %s] Bumped group epoch to %d with metadata hash %d.", group_id, epoch, new_hash)
    return GroupEpochRecord(group_id, epoch, new_hash)
