"""Kafka's partitionFor: the §7.1 vectors (computed with Java) and the properties that make it Java's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.group.partitioner import java_string_hash, kafka_abs, partition_for

VECTORS = [  # (group id, Java String.hashCode, partition of 50)
    ("my-group", -1906497762, 12),
    ("test-consumer-group", -1793216381, 31),
    ("polygenelubricants", -2147483648, 0),
    ("", 0, 0),
    ("console-consumer-12345", 158455506, 6),
    ("grüppe", -1233264812, 12),
    ("g😀", 1871882, 32),
]


@pytest.mark.parametrize(("group_id", "java_hash", "partition"), VECTORS)
def test_kafka_vectors(group_id: str, java_hash: int, partition: int) -> None:
    assert java_string_hash(group_id) == java_hash
    assert partition_for(group_id, 50) == partition


def test_min_value_hash_maps_to_partition_zero_not_a_negative_index() -> None:
    assert kafka_abs(-(2**31)) == 0
    assert kafka_abs(-5) == 5
    assert partition_for("polygenelubricants", 7) == 0


def test_characters_outside_the_bmp_hash_as_two_surrogate_units() -> None:
    high, low = 0xD83D, 0xDE00  # 😀 in UTF-16
    assert java_string_hash("😀") == 31 * high + low


@given(st.text(max_size=40), st.integers(min_value=1, max_value=1000))
def test_partition_is_in_range_and_hash_is_signed_32_bit(group_id: str, num_partitions: int) -> None:
    assert 0 <= partition_for(group_id, num_partitions) < num_partitions
    assert -(2**31) <= java_string_hash(group_id) < 2**31


@given(st.text(max_size=20), st.characters(codec="utf-16", exclude_categories=("Cs",)))
def test_hash_follows_javas_recurrence(prefix: str, char: str) -> None:
    units = char.encode("utf-16-be")
    expected = java_string_hash(prefix)
    for i in range(0, len(units), 2):
        expected = (31 * expected + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    expected = expected - 2**32 if expected >= 2**31 else expected
    assert java_string_hash(prefix + char) == expected


def test_non_positive_partition_count_is_rejected() -> None:
    with pytest.raises(ValueError):
        partition_for("g", 0)
