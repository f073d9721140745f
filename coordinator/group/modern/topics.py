"""The consumer group logic's digest of the topics it is subscribed to (the topics themselves: coordinator/topics.py),
and the group epoch bump that records it."""

from __future__ import annotations

import hashlib
import logging
import struct
from collections.abc import Iterable

from coordinator.group.modern.records import GroupEpochRecord
from coordinator.topics import TopicImage, TopicsView

log = logging.getLogger("coordinator.group")

_HASHES: dict[tuple[TopicImage, ...], int] = {}  # digests of recent topic sets (a pure function of the images)
_HASHES_KEPT = 4_096


def metadata_hash(names: Iterable[str], topics: TopicsView) -> int:
    """A 64-bit digest of the subscribed topics that exist (id, name, partition count), 0 for none. It changes
    exactly when Kafka's does for what we track (racks are not known here); the value is not Kafka's XXH3, so
    Kafka loading our records would bump the epoch once."""
    images = tuple(sorted((t for t in (topics.by_name(n) for n in set(names)) if t is not None),
                          key=lambda t: t.name))
    if not images:
        return 0
    known = _HASHES.get(images)
    if known is not None:  # every group looks at its topics once per heartbeat interval: mostly the same ones
        return known
    digest = hashlib.blake2b(digest_size=8)
    for image in images:
        encoded = image.name.encode()
        digest.update(image.topic_id.bytes + struct.pack(">i", len(encoded)) + encoded
                      + struct.pack(">i", image.partitions))
    value = struct.unpack(">q", digest.digest())[0] or 1
    if len(_HASHES) >= _HASHES_KEPT:
        _HASHES.clear()
    _HASHES[images] = value
    return value


def bumped_group_epoch(group_id: str, epoch: int, new_hash: int) -> GroupEpochRecord:
    """A bump as a member's request or a regular expression's resolution makes it, with Kafka 4.1's line."""
    log.info("[GroupId %s] Bumped group epoch to %d with metadata hash %d.", group_id, epoch, new_hash)
    return GroupEpochRecord(group_id, epoch, new_hash)
