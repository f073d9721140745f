"""Consumer-protocol payloads (JoinGroup metadata, SyncGroup assignment) in every version."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.consumer_protocol import (
    Assignment,
    ConsumerProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)

_names = st.text(min_size=1, max_size=10)
_partitions = st.lists(st.tuples(_names, st.lists(st.integers(0, 2**31 - 1), max_size=4).map(tuple)), max_size=4).map(
    tuple
)


@given(
    topics=st.lists(_names, max_size=5).map(tuple),
    user_data=st.none() | st.binary(max_size=20),
    owned=_partitions,
    generation_id=st.integers(-1, 2**31 - 1),
    rack_id=st.none() | _names,
)
def test_subscription_v3_round_trips(topics, user_data, owned, generation_id, rack_id) -> None:
    subscription = Subscription(topics, user_data, owned, generation_id, rack_id)
    assert decode_subscription(encode_subscription(subscription)) == (3, subscription)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscription_keeps_only_the_fields_of_its_version(version: int) -> None:
    full = Subscription(("a", "b"), b"u", (("a", (1, 2)),), 7, "rack")
    decoded_version, decoded = decode_subscription(encode_subscription(full, version))
    assert decoded_version == version
    assert decoded.topics == ("a", "b") and decoded.user_data == b"u"
    assert decoded.owned_partitions == (full.owned_partitions if version >= 1 else ())
    assert decoded.generation_id == (7 if version >= 2 else -1)
    assert decoded.rack_id == ("rack" if version >= 3 else None)


def test_subscription_v0_bytes_are_kafkas_layout() -> None:
    encoded = encode_subscription(Subscription(("t",), None), version=0)
    # version 0, one topic "t", null user data
    assert encoded == struct.pack(">hih1si", 0, 1, 1, b"t", -1)


@given(partitions=_partitions, user_data=st.none() | st.binary(max_size=20), version=st.integers(0, 3))
def test_assignment_round_trips_in_every_version(partitions, user_data, version) -> None:
    assignment = Assignment(partitions, user_data)
    assert decode_assignment(encode_assignment(assignment, version)) == (version, assignment)


def test_a_newer_version_is_read_with_our_newest_schema_ignoring_appended_fields() -> None:
    v3 = encode_subscription(Subscription(("t",), None, (), 3, "r"), version=3)
    v9 = struct.pack(">h", 9) + v3[2:] + b"future field"
    version, subscription = decode_subscription(v9)
    assert version == 9 and subscription.topics == ("t",) and subscription.rack_id == "r"


@pytest.mark.parametrize("data", [b"", b"\x00", struct.pack(">h", -1) + b"\x00" * 8, b"\x00\x00\x00\x00\x00\x09"])
def test_bad_payloads_raise_consumer_protocol_error(data: bytes) -> None:
    with pytest.raises(ConsumerProtocolError):
        decode_subscription(data)
