"""The consumer group logic's digest of the topics it is subscribed to (the topics themselves: coordinator/topics.py)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

from coordinator.topics import TopicsView


def metadata_hash(names: Iterable[str], topics: TopicsView) -> int:
    """A 64-bit digest of the subscribed topics that exist (id, name, partition count), 0 for none. It changes
    exactly when Kafka's does for what we track (racks are not known here); the value is not Kafka's XXH3, so
    Kafka loading our records would bump the epoch once."""
    images = sorted((t for t in (topics.by_name(n) for n in set(names)) if t is not None), key=lambda t: t.name)
    if not images:
        return 0
    digest = hashlib.blake2b(digest_size=8)
    for image in images:
        encoded = image.name.encode()
        digest.update(image.topic_id.bytes + struct.pack(">i", len(encoded)) + encoded
                      + struct.pack(">i", image.partitions))
    return struct.unpack(">q", digest.digest())[0] or 1
