"""protocol/fetch_reader.py on bytes made here: batches written by kio's writer parse back field by field; a
partial batch at the end is left out; hostile bytes (random mutations of a valid Fetch answer, with and without
a recomputed crc) raise FetchFormatError and nothing else."""

from __future__ import annotations

import datetime
import random
import struct

import crc32c
import pytest

from kio.schema.errors import ErrorCode
from kio.schema.types import BrokerId
from kio.static.primitive import i32, i64

from protocol import codec
from protocol.messages import build
from protocol.fetch_reader import (FetchError, FetchFormatError, FetchFrame, MarkerType, fetch_request, parse_batches,
                                   parse_fetch_response)
from tests.support.transactions_wire import Producer, batch

PRODUCER = Producer("app", 4242, 3)


def control_batch(offset: int, marker: MarkerType) -> bytes:
    """A control batch as the broker writes it: one record, key (version 0, type), value (version, epoch)."""
    key, value = struct.pack(">hh", 0, marker), struct.pack(">hi", 0, 7)
    record = bytes([0, 0, 0]) + _varint(len(key)) + key + _varint(len(value)) + value + _varint(0)
    records = _varint(len(record)) + record
    body = struct.pack(">hiqqqhii", 0x30, 0, 0, 0, PRODUCER.producer_id, PRODUCER.epoch, -1, 1) + records
    head = struct.pack(">qiib", offset, 4 + 1 + 4 + len(body), 0, 2)
    return head + struct.pack(">I", crc32c.crc32c(body)) + body


def _varint(value: int) -> bytes:
    raw, out = (value << 1) ^ (value >> 63), bytearray()
    while raw > 0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def at_offset(data: bytes, offset: int) -> bytes:
    return struct.pack(">q", offset) + data[8:]


def log_bytes() -> bytes:
    first = batch(PRODUCER, 5, (b"k", b"v"), (None, b"w"), (b"x", None))
    second = at_offset(batch(PRODUCER, 8, (b"k2", b"v2"), transactional=False), 3)
    return first + second + control_batch(4, MarkerType.COMMIT)


def test_batches_parse_back_field_by_field() -> None:
    data, plain, marker = parse_batches(log_bytes())
    assert (data.base_offset, data.last_offset, data.producer_id, data.producer_epoch, data.base_sequence,
            data.is_transactional, data.is_control, data.marker) == (0, 2, 4242, 3, 5, True, False, None)
    assert [tuple(r) for r in data.records] == [(0, b"k", b"v"), (1, None, b"w"), (2, b"x", None)]
    assert (plain.base_offset, plain.is_transactional, [tuple(r) for r in plain.records]) == (3, False, [(3, b"k2", b"v2")])
    assert (marker.base_offset, marker.is_control, marker.marker, marker.records) == (4, True, MarkerType.COMMIT, ())


def test_batches_whose_records_are_not_wanted_come_with_their_header_only() -> None:
    asked: list[tuple[int, bool]] = []

    def wants_records(producer_id: int, transactional: bool) -> bool:
        asked.append((producer_id, transactional))
        return transactional

    data, plain, marker = parse_batches(log_bytes(), wants_records=wants_records)
    assert asked == [(4242, True), (4242, False)]  # a control batch is always read (its marker)
    assert len(data.records) == 3 and marker.marker == MarkerType.COMMIT
    assert (plain.base_offset, plain.last_offset, plain.is_transactional, plain.records) == (3, 3, False, ())


def test_a_partial_last_batch_is_left_for_the_next_fetch() -> None:
    data = log_bytes()
    for cut in range(len(data) - 30, len(data)):
        assert [b.base_offset for b in parse_batches(data[:cut])] == [0, 3]


def test_a_crc_mismatch_is_refused() -> None:
    data = bytearray(log_bytes())
    data[70] ^= 0x01
    with pytest.raises(FetchFormatError, match="crc"):
        parse_batches(bytes(data))


def fetch_response_frame(records: bytes, topic: str = "t") -> bytes:
    from kio.schema.fetch.v12.response import FetchableTopicResponse, FetchResponse, PartitionData
    body = build(FetchResponse, throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=i32(0),
                 responses=(build(FetchableTopicResponse, topic=topic, partitions=(build(
                     PartitionData, partition_index=i32(0), error_code=ErrorCode.none, high_watermark=i64(5),
                     last_stable_offset=i64(5), log_start_offset=i64(0), aborted_transactions=None,
                     preferred_read_replica=BrokerId(-1), records=records),)),))
    return codec.encode_response_frame(9, 1, body)[4:]


def test_a_fetch_answer_parses() -> None:
    answer = parse_fetch_response(fetch_response_frame(log_bytes()), "t", 0, 0)
    assert [b.base_offset for b in answer.batches] == [0, 3, 4]
    assert (answer.high_watermark, answer.next_offset) == (5, 5)


def _with_crcs_fixed(data: bytearray) -> bytearray:
    """Recompute each batch's crc where the lengths still frame it, so mutations reach the record parser."""
    position = 0
    while len(data) - position >= 61:
        (length,) = struct.unpack_from(">i", data, position + 8)
        end = position + 12 + length
        if length < 49 or end > len(data):
            break
        struct.pack_into(">I", data, position + 17, crc32c.crc32c(bytes(data[position + 21:end])))
        position = end
    return data


@pytest.mark.parametrize("fix_crc", [False, True])
def test_hostile_bytes_give_a_clean_error(fix_crc: bool) -> None:
    rng = random.Random(26 + fix_crc)
    records = log_bytes()
    frame = fetch_response_frame(records)
    records_start = frame.index(records)
    outcomes = {"parsed": 0, "refused": 0}
    for _ in range(400):
        mutated = bytearray(frame)
        for _flip in range(rng.randint(1, 6)):
            where = rng.randrange(len(mutated)) if rng.random() < 0.3 else rng.randrange(records_start, len(mutated))
            mutated[where] = rng.randrange(256)
        if rng.random() < 0.2:
            del mutated[rng.randrange(len(mutated)):]
        if fix_crc:
            mutated[records_start:] = _with_crcs_fixed(mutated[records_start:])
        try:
            answer = parse_fetch_response(bytes(mutated), "t", 0, 0)
        except (FetchFormatError, FetchError):  # FetchError: a mutated error code
            outcomes["refused"] += 1
        else:
            outcomes["parsed"] += 1
            for parsed in answer.batches:
                assert parsed.last_offset >= parsed.base_offset
    assert outcomes["refused"] > 100 and outcomes["parsed"] > 0, outcomes


@pytest.mark.parametrize("topic", ["t", "__coordinator_state", "z" * 249])
def test_a_fetch_frame_patched_per_fetch_equals_the_request_encoded_afresh(topic: str) -> None:
    frame = FetchFrame("group-coordinator-loader", topic, 7, max_bytes=5_242_880)
    for correlation_id, offset, wait_ms, min_bytes in ((1, 0, 250, 16_384), (2**31 - 1, 2**62 + 5, 30_000, 1),
                                                       (17, 123_456, 0, 1)):
        fresh = codec.encode_request(correlation_id, "group-coordinator-loader", fetch_request(
            topic, 7, offset, max_bytes=5_242_880, max_wait_ms=wait_ms, min_bytes=min_bytes))
        assert frame.frame(correlation_id, offset, max_wait_ms=wait_ms, min_bytes=min_bytes) == fresh
