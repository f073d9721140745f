"""The group id → partition cache keeps the ids clients keep asking about, not every id a client invents."""

from __future__ import annotations

import tracemalloc

import pytest

from coordinator.group.partitioner import PartitionCache, cached_partition_for, partition_for


def test_answers_are_kafkas_whether_cached_or_not() -> None:
    cache = PartitionCache(50)
    for group_id in ("my-group", "test-consumer-group", "polygenelubricants", "", "grüppe", "g😀") * 3:
        assert cache.partition(group_id) == partition_for(group_id, 50)
        assert cached_partition_for(group_id, 50) == partition_for(group_id, 50)


def test_an_id_asked_about_once_is_not_kept() -> None:
    cache = PartitionCache(50)
    for index in range(10_000):
        cache.partition(f"invented-{index}")
    assert len(cache) == 0


def test_an_id_asked_about_again_later_is_kept_not_one_asked_about_in_a_burst() -> None:
    cache = PartitionCache(50, doorkeeper_slots=1 << 10, recurrence_s=0)
    cache.partition("live-group")
    assert len(cache) == 0
    cache.partition("live-group")
    assert len(cache) == 1
    burst = PartitionCache(50, recurrence_s=3_600)  # a connection's requests about one id, within the hour
    for _ in range(5):
        burst.partition("invented")
    assert len(burst) == 0
    for index in range(5_000):  # other ids overwriting the doorkeeper do not evict a kept id
        cache.partition(f"other-{index}")
    assert cache.partition("live-group") == partition_for("live-group", 50)
    assert len(cache) == 1


def test_full_cache_starts_over_and_long_ids_are_never_kept() -> None:
    cache = PartitionCache(50, max_entries=100, max_id_chars=16, recurrence_s=0)
    kept = cache.kept
    for index in range(150):
        cache.partition(f"g-{index}")
        cache.partition(f"g-{index}")
    assert len(cache) == 50  # cleared at 100, refilled with the last 50
    assert cache.kept is kept  # emptied in place: the runtime holds this dict
    cache.partition("x" * 17)
    cache.partition("x" * 17)
    assert len(cache) == 50


def test_memory_does_not_grow_with_invented_ids() -> None:
    cache = PartitionCache(50)
    cache.partition("warm-up")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for index in range(20_000):
            for _ in range(3):  # a connection's batch asks about its id more than once
                cache.partition(f"invented-group-id-{index:08d}")
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 20_000  # < 1 byte per id (an lru_cache kept ~150 bytes per id)


def test_doorkeeper_size_must_be_a_power_of_two() -> None:
    with pytest.raises(ValueError):
        PartitionCache(50, doorkeeper_slots=1000)
