"""State-topic record codec: hand-computed bytes from Kafka's JSON schemas, and hypothesis round trips."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

import coordinator.storage.records as records_module
from coordinator.compiled import running_compiled
from coordinator.storage.records import (
    GroupMetadataKey, GroupRecord, MemberRecord, OffsetCommitKey, OffsetRecord,
    RecordFormatError, StateRecord, UnknownKey, decode_group_metadata_value, decode_key,
    decode_offset_commit_value, decode_record, encode_group_metadata_value, encode_group_metadata_value_general,
    encode_key,
    encode_offset_commit_value, encode_record,
)


def s16(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def i32(n: int) -> bytes:
    return struct.pack(">i", n)


def i64(n: int) -> bytes:
    return struct.pack(">q", n)


MEMBER = MemberRecord(member_id="m1", client_id="c", client_host="/h", session_timeout_ms=10000,
                      rebalance_timeout_ms=300000, subscription=b"\x01", assignment=b"", group_instance_id=None)
GROUP = GroupRecord(protocol_type="consumer", generation=1, protocol="range", leader="m1",
                    current_state_timestamp_ms=10, members=[MEMBER])


# ---- hand-computed bytes ---------------------------------------------------------------------------------------

def test_group_metadata_key_is_version_2_and_the_group_id() -> None:
    assert encode_key(GroupMetadataKey("g1")) == b"\x00\x02" + b"\x00\x02g1"


def test_offset_commit_key_is_written_as_version_1() -> None:
    assert encode_key(OffsetCommitKey("g", "t", 3)) == b"\x00\x01" + s16("g") + s16("t") + i32(3)


def test_offset_commit_key_version_0_reads_the_same() -> None:
    assert decode_key(b"\x00\x00" + s16("g") + s16("t") + i32(3)) == OffsetCommitKey("g", "t", 3)


def test_offset_commit_value_v3_has_leader_epoch_and_no_expire() -> None:
    value = OffsetRecord(offset=5, metadata="m", commit_timestamp_ms=1000, leader_epoch=7)
    assert encode_offset_commit_value(value) == b"\x00\x03" + i64(5) + i32(7) + s16("m") + i64(1000)


def test_offset_commit_value_with_expire_timestamp_is_written_as_v1() -> None:
    value = OffsetRecord(offset=5, metadata="m", commit_timestamp_ms=1000, leader_epoch=7,
                              expire_timestamp_ms=2000)
    encoded = encode_offset_commit_value(value)
    assert encoded == b"\x00\x01" + i64(5) + s16("m") + i64(1000) + i64(2000)
    # v1 has no leader epoch: it reads back as unknown (-1), as in Kafka
    assert decode_offset_commit_value(encoded).leader_epoch == -1


def test_group_metadata_value_v3_bytes() -> None:
    member = s16("m1") + b"\xff\xff" + s16("c") + s16("/h") + i32(300000) + i32(10000) + i32(1) + b"\x01" + i32(0)
    expected = (b"\x00\x03" + s16("consumer") + i32(1) + s16("range") + s16("m1") + i64(10) + i32(1) + member)
    assert encode_group_metadata_value(GROUP) == expected
    assert decode_group_metadata_value(expected) == GROUP


def test_empty_group_has_null_protocol_and_leader() -> None:
    empty = GroupRecord(protocol_type="consumer", generation=2, protocol=None, leader=None,
                               current_state_timestamp_ms=-1)
    expected = b"\x00\x03" + s16("consumer") + i32(2) + b"\xff\xff" + b"\xff\xff" + i64(-1) + i32(0)
    assert encode_group_metadata_value(empty) == expected


def test_group_metadata_value_v0_reads_rebalance_timeout_as_session_timeout() -> None:
    member = s16("m1") + s16("c") + s16("/h") + i32(10000) + i32(1) + b"\x01" + i32(0)
    data = b"\x00\x00" + s16("consumer") + i32(1) + s16("range") + s16("m1") + i32(1) + member
    decoded = decode_group_metadata_value(data)
    assert decoded.members[0].rebalance_timeout_ms == 10000
    assert decoded.current_state_timestamp_ms == -1


def test_flexible_v4_uses_compact_lengths_and_tagged_fields() -> None:
    value = OffsetRecord(offset=1, metadata="ab", commit_timestamp_ms=2, leader_epoch=3)
    encoded = encode_offset_commit_value(value, version=4)
    assert encoded == b"\x00\x04" + i64(1) + i32(3) + b"\x03ab" + i64(2) + b"\x00"
    empty = GroupRecord("", 0, None, None)
    assert encode_group_metadata_value(empty, version=4) == b"\x00\x04\x01" + i32(0) + b"\x00\x00" + i64(-1) + b"\x01\x00"


def test_flexible_decoder_skips_unknown_tagged_fields() -> None:
    # offset value v4 with one tagged field (tag 5, 2 bytes) a newer writer might add
    data = b"\x00\x04" + i64(1) + i32(3) + b"\x03ab" + i64(2) + b"\x01\x05\x02zz"
    assert decode_offset_commit_value(data) == OffsetRecord(1, 3, "ab", 2)


# ---- whole records, tombstones, unknown versions ---------------------------------------------------------------

def test_tombstone_decodes_to_a_record_without_value() -> None:
    key_bytes, value_bytes = encode_record(GroupMetadataKey("g"), None)
    assert value_bytes is None
    assert decode_record(key_bytes, None) == StateRecord(GroupMetadataKey("g"), None)


def test_unknown_key_version_decodes_to_unknown_key_and_ignores_the_value() -> None:
    raw = b"\x00\x03" + s16("consumer-group-record")
    record = decode_record(raw, b"\x00\x00garbage")
    assert record == StateRecord(UnknownKey(3, raw), None)


@pytest.mark.parametrize("version", [-1, 5, 99])
def test_unknown_value_version_is_a_format_error(version: int) -> None:
    with pytest.raises(RecordFormatError):
        decode_offset_commit_value(struct.pack(">h", version) + i64(1))
    with pytest.raises(RecordFormatError):
        decode_group_metadata_value(struct.pack(">h", version))


def test_key_and_value_type_mismatch_is_refused() -> None:
    with pytest.raises(TypeError):
        encode_record(GroupMetadataKey("g"), OffsetRecord(1, "", 0))


def test_overlong_string_is_refused() -> None:
    with pytest.raises(RecordFormatError):
        encode_key(GroupMetadataKey("x" * 40000))


# ---- hypothesis ------------------------------------------------------------------------------------------------

text = st.text(max_size=12)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
members = st.builds(MemberRecord, member_id=text, client_id=text, client_host=text,
                    session_timeout_ms=int32, rebalance_timeout_ms=int32, subscription=st.binary(max_size=20),
                    assignment=st.binary(max_size=20), group_instance_id=st.none() | text)
groups = st.builds(GroupRecord, protocol_type=text, generation=int32, protocol=st.none() | text,
                   leader=st.none() | text, current_state_timestamp_ms=int64,
                   members=st.lists(members, max_size=4))
offsets = st.builds(OffsetRecord, offset=int64, metadata=text, commit_timestamp_ms=int64,
                    leader_epoch=int32, expire_timestamp_ms=st.none() | int64.filter(lambda ms: ms != -1))


@given(groups, text)
def test_group_record_round_trips_in_the_written_version(group: GroupRecord, group_id: str) -> None:
    key_bytes, value_bytes = encode_record(GroupMetadataKey(group_id), group)
    assert decode_record(key_bytes, value_bytes) == StateRecord(GroupMetadataKey(group_id), group)


@given(offsets, text, text, int32)
def test_offset_record_round_trips_keeping_what_its_version_holds(
        value: OffsetRecord, group: str, topic: str, partition: int) -> None:
    key = OffsetCommitKey(group, topic, partition)
    decoded = decode_record(*encode_record(key, value))
    assert decoded.key == key
    if value.expire_timestamp_ms is None:
        assert decoded.value == value
    else:  # written as v1: keeps the expire timestamp, has no leader epoch
        assert decoded.value == OffsetRecord(value.offset, -1, value.metadata, value.commit_timestamp_ms,
                                             value.expire_timestamp_ms)


@given(groups, st.integers(0, 4))
def test_every_group_value_version_round_trips_modulo_missing_fields(group: GroupRecord, version: int) -> None:
    decoded = decode_group_metadata_value(encode_group_metadata_value(group, version))
    expected_ts = group.current_state_timestamp_ms if version >= 2 else -1
    assert decoded.current_state_timestamp_ms == expected_ts
    assert (decoded.protocol_type, decoded.generation, decoded.protocol, decoded.leader) == (
        group.protocol_type, group.generation, group.protocol, group.leader)
    for got, sent in zip(decoded.members, group.members, strict=True):
        assert got.group_instance_id == (sent.group_instance_id if version >= 3 else None)
        assert got.rebalance_timeout_ms == (sent.rebalance_timeout_ms if version >= 1 else sent.session_timeout_ms)
        assert (got.member_id, got.subscription, got.assignment) == (sent.member_id, sent.subscription, sent.assignment)


@given(offsets, st.integers(0, 4))
def test_every_offset_value_version_round_trips_modulo_missing_fields(value: OffsetRecord, version: int) -> None:
    decoded = decode_offset_commit_value(encode_offset_commit_value(value, version))
    assert (decoded.offset, decoded.metadata, decoded.commit_timestamp_ms) == (
        value.offset, value.metadata, value.commit_timestamp_ms)
    assert decoded.leader_epoch == (value.leader_epoch if version >= 3 else -1)
    assert decoded.expire_timestamp_ms == (value.expire_timestamp_ms if version == 1 else None)


@given(groups, st.data())
def test_truncated_group_value_is_a_format_error_never_another_exception(group: GroupRecord, data) -> None:
    encoded = encode_group_metadata_value(group)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(RecordFormatError):
        decode_group_metadata_value(encoded[:cut])


@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_format_error(data: bytes) -> None:
    try:
        decode_record(b"\x00\x02" + s16("g"), data)
        decode_record(b"\x00\x01" + s16("g") + s16("t") + i32(0), data)
    except RecordFormatError:
        pass


# ---- the v3 group value's member cache against the general writer ---------------------------------------------

def _outcome(encode: Callable[[], bytes]) -> bytes | type[BaseException]:
    try:
        return encode()
    except Exception as exc:  # the general writer's refusal, whatever its type
        return type(exc)


# Odd values within the record's declared types (a compiled MemberRecord refuses any other when made: None where
# a str is declared, a float where an int is): too long, unencodable, out of int32's range, a bool (an int).
odd_text = st.text(max_size=4) | st.just("x" * 32768) | st.just("\ud800")
odd_int = int32 | st.integers(2**31, 2**40) | st.just(True)
odd_members = st.builds(MemberRecord, member_id=odd_text, client_id=odd_text, client_host=odd_text,
                        session_timeout_ms=odd_int, rebalance_timeout_ms=odd_int,
                        subscription=st.binary(max_size=20), assignment=st.binary(max_size=20),
                        group_instance_id=st.none() | odd_text)


@given(groups, st.data())
def test_v3_group_value_is_the_general_writers_bytes_when_encoded_again_and_after_changes(
        group: GroupRecord, data: st.DataObject) -> None:
    general = encode_group_metadata_value_general(group, 3)
    assert encode_group_metadata_value(group) == general
    assert encode_group_metadata_value(group) == general  # the members' heads now come from the cache
    if group.members:
        member = data.draw(st.sampled_from(group.members))
        field_name = data.draw(st.sampled_from(["member_id", "client_id", "client_host", "group_instance_id",
                                                "rebalance_timeout_ms", "session_timeout_ms", "subscription",
                                                "assignment"]))
        new_value = data.draw({"group_instance_id": st.none() | text, "subscription": st.binary(max_size=20),
                               "assignment": st.binary(max_size=20), "rebalance_timeout_ms": int32,
                               "session_timeout_ms": int32}.get(field_name, text))
        setattr(member, field_name, new_value)
        assert encode_group_metadata_value(group) == encode_group_metadata_value_general(group, 3)


@given(st.lists(odd_members, max_size=3), st.booleans())
def test_v3_group_value_refuses_what_the_general_writer_refuses(members: list[MemberRecord], warm: bool) -> None:
    group = GroupRecord("consumer", 1, "range", None, 0, members)
    if warm:  # values equal to these (1.0 == 1 == True) may already be cached
        for member in members:
            try:
                encode_group_metadata_value(GroupRecord("consumer", 1, "range", None, 0, [member]))
            except Exception:
                pass
    assert _outcome(lambda: encode_group_metadata_value(group)) == \
        _outcome(lambda: encode_group_metadata_value_general(group, 3))


def test_member_head_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records_module, "MEMBER_HEADS_MAX", 10)
    monkeypatch.setattr(records_module, "_MEMBER_HEADS", {})
    group = GroupRecord("consumer", 1, "range", None, 0,
                        [MemberRecord(f"m{i}", None, "c", "/h", 1, 1, b"", b"") for i in range(25)])
    assert encode_group_metadata_value(group) == encode_group_metadata_value_general(group, 3)
    assert 0 < len(records_module._MEMBER_HEADS) <= 10


def test_a_cached_head_is_not_taken_for_an_equal_float() -> None:
    """A float where the record declares an int (1.0 == 1, one hash) never gets the cached head of the int: it is
    refused as the general writer refuses it (struct.error), or, compiled, by the record itself when made."""
    cached = MemberRecord("float-twin", None, "c", "/h", 1, 1, b"", b"")
    encode_group_metadata_value(GroupRecord("consumer", 1, "range", None, 0, [cached]))

    def twin() -> GroupRecord:
        member = MemberRecord("float-twin", None, "c", "/h", 1.0, 1, b"", b"")  # type: ignore[arg-type]
        return GroupRecord("consumer", 1, "range", None, 0, [member])

    refused = _outcome(lambda: encode_group_metadata_value(twin()))
    assert refused == _outcome(lambda: encode_group_metadata_value_general(twin(), 3))
    compiled = running_compiled([MemberRecord.__module__]) == {MemberRecord.__module__: True}
    assert refused is (TypeError if compiled else struct.error)
