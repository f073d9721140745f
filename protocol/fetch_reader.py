"""A raw Fetch reader: one partition's record batches (v2) with every header field, control markers included.

confluent-kafka cannot show what a transaction-tracking reader needs: librdkafka never hands control records to
the application, and read_uncommitted it delivers an aborted transaction's records as ordinary ones. So this
module sends Fetch itself over protocol/client.py and parses the record batches by hand (Kafka's
DefaultRecordBatch / DefaultRecord layout), every length checked against the bytes that are there before it is
used: the broker's bytes are untrusted like a client's (protocol/tolerant.py), and the Fetch response is decoded
with tolerant.read_entity, never kio's native reader. Anything malformed raises FetchFormatError.

A Fetch answer may end with a partial batch (the broker cuts at the byte limit): it is not an error, the reader
returns the complete batches and the next fetch starts at the first offset not returned.
"""

from __future__ import annotations

import datetime
import enum
import struct
import zlib
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, NamedTuple

import crc32c
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.fetch.v12.response import FetchResponse
from kio.serial.errors import SerialError
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i32, i32Timedelta, i64
from kio.schema.types import BrokerId, TopicName

from protocol import apis, codec
from protocol.client import KafkaClient
from protocol.errors import ProtocolError
from protocol.tolerant import read_entity

FETCH_VERSION = 12  # the last version that names topics (13+ use topic ids)

# batch header: base offset, batch length, leader epoch, magic, crc, then what the crc covers: attributes,
# last offset delta, base timestamp, max timestamp, producer id, producer epoch, base sequence, record count
_BATCH_HEAD = struct.Struct(">qiibI")
_BATCH_BODY = struct.Struct(">hiqqqhii")
_HEADER_SIZE = _BATCH_HEAD.size + _BATCH_BODY.size  # 61
_LOG_OVERHEAD = 12  # base offset + batch length: batch length counts the bytes after them
_CONTROL_KEY = struct.Struct(">hh")  # version, type

_COMPRESSION_MASK = 0x07
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_GZIP = 1


class FetchFormatError(ValueError):
    """The Fetch answer or a record batch in it is malformed."""


class FetchError(RuntimeError):
    """The broker answered the Fetch with an error code for the partition (or the whole request)."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class MarkerType(enum.IntEnum):
    """A control batch's marker (Kafka's ControlRecordType)."""
    ABORT = 0
    COMMIT = 1


class FetchedRecord(NamedTuple):
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    is_control: bool
    marker: MarkerType | None  # for a control batch: ABORT or COMMIT (None for another control type)
    records: tuple[FetchedRecord, ...]  # a data batch's records; empty for a control batch


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    batches: list[FetchedBatch]
    next_offset: int  # where the next fetch starts: after the last complete batch, or the fetch offset


# ------------------------------------------------------------------------------------------------ batches


# whether a data batch's records are wanted, from its producer id and transactional flag (else left unparsed)
WantsRecords = Callable[[int, bool], bool]


def parse_batches(data: bytes, *, wants_records: WantsRecords | None = None) -> list[FetchedBatch]:
    """The complete v2 record batches in `data`; a partial batch at the end is left out. A data batch that
    `wants_records` declines comes with its header fields only (its crc still checked)."""
    view = memoryview(data)
    batches = []
    position = 0
    while len(data) - position >= _LOG_OVERHEAD:
        base_offset, batch_length = struct.unpack_from(">qi", data, position)
        size = _LOG_OVERHEAD + batch_length
        if batch_length < _HEADER_SIZE - _LOG_OVERHEAD:
            raise FetchFormatError(f"batch at offset {base_offset}: length {batch_length} below the header's")
        if len(data) - position < size:
            break  # cut by the fetch's byte limit
        batches.append(_parse_batch(view[position:position + size], wants_records))
        position += size
    return batches


def _parse_batch(batch: memoryview, wants_records: WantsRecords | None = None) -> FetchedBatch:
    base_offset, _length, _leader_epoch, magic, crc = _BATCH_HEAD.unpack_from(batch, 0)
    if magic != 2:
        raise FetchFormatError(f"batch at offset {base_offset}: magic {magic}, only v2 is read")
    if crc32c.crc32c(batch[_BATCH_HEAD.size:]) != crc:
        raise FetchFormatError(f"batch at offset {base_offset}: crc mismatch")
    (attributes, last_offset_delta, _base_ts, _max_ts, producer_id, producer_epoch, base_sequence,
     count) = _BATCH_BODY.unpack_from(batch, _BATCH_HEAD.size)
    if last_offset_delta < 0 or count < 0:
        raise FetchFormatError(f"batch at offset {base_offset}: negative last offset delta or record count")
    is_control = bool(attributes & _CONTROL)
    if not is_control and wants_records is not None and not wants_records(producer_id,
                                                                         bool(attributes & _TRANSACTIONAL)):
        return FetchedBatch(base_offset, base_offset + last_offset_delta, producer_id, producer_epoch,
                            base_sequence, bool(attributes & _TRANSACTIONAL), False, None, ())
    body = bytes(batch[_HEADER_SIZE:])
    compression = attributes & _COMPRESSION_MASK
    if compression == _GZIP:
        body = _gunzip(body, base_offset)
    elif compression != 0:
        raise FetchFormatError(f"batch at offset {base_offset}: compression type {compression} is not read here")
    if count > len(body):  # every record takes at least one byte
        raise FetchFormatError(f"batch at offset {base_offset}: {count} records in {len(body)} bytes")
    records = _parse_records(body, count, base_offset)
    marker = None
    if is_control:
        marker = _marker(records, base_offset)
        records = ()
    return FetchedBatch(base_offset, base_offset + last_offset_delta, producer_id, producer_epoch, base_sequence,
                        bool(attributes & _TRANSACTIONAL), is_control, marker, records)


def _gunzip(body: bytes, base_offset: int) -> bytes:
    try:
        return zlib.decompress(body, wbits=31)
    except zlib.error as exc:
        raise FetchFormatError(f"batch at offset {base_offset}: bad gzip data: {exc}") from None


def _marker(records: tuple[FetchedRecord, ...], base_offset: int) -> MarkerType | None:
    if len(records) != 1 or records[0].key is None or len(records[0].key) < _CONTROL_KEY.size:
        raise FetchFormatError(f"control batch at offset {base_offset}: not one record with a control key")
    _version, control_type = _CONTROL_KEY.unpack_from(records[0].key)
    return MarkerType(control_type) if control_type in (0, 1) else None


def _parse_records(body: bytes, count: int, base_offset: int) -> tuple[FetchedRecord, ...]:
    records = []
    position = 0
    end = len(body)
    try:
        for _ in range(count):
            length, position = _varint(body, position)
            record_end = position + length
            if length < 0 or record_end > end:
                raise FetchFormatError(f"batch at offset {base_offset}: record of {length} bytes past the batch")
            position += 1  # attributes
            _timestamp_delta, position = _varint(body, position)
            offset_delta, position = _varint(body, position)
            key, position = _bytes(body, position, record_end)
            value, position = _bytes(body, position, record_end)
            headers, position = _varint(body, position)
            for _header in range(headers):
                _header_key, position = _bytes(body, position, record_end)
                _header_value, position = _bytes(body, position, record_end)
            if position != record_end:
                raise FetchFormatError(f"batch at offset {base_offset}: record length does not match its fields")
            records.append(FetchedRecord(base_offset + offset_delta, key, value))
    except IndexError:
        raise FetchFormatError(f"batch at offset {base_offset}: records run past the batch") from None
    return tuple(records)


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """A zig-zag varint (Kafka's ByteUtils.readVarlong: at most 10 bytes)."""
    first = data[position]  # IndexError past the end: the caller's
    if first < 0x80:  # one byte: most lengths and deltas
        return (first >> 1) ^ -(first & 1), position + 1
    shift = 0
    raw = 0
    while True:
        byte = data[position]  # IndexError past the end: the caller's
        position += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), position
        shift += 7
        if shift > 63:
            raise FetchFormatError("varint longer than 10 bytes")


def _bytes(data: bytes, position: int, limit: int) -> tuple[bytes | None, int]:
    length, position = _varint(data, position)
    if length < 0:
        return None, position
    if position + length > limit:
        raise FetchFormatError(f"field of {length} bytes past its record")
    return data[position:position + length], position + length


# ------------------------------------------------------------------------------------------------ Fetch


def fetch_request(topic: str, partition: int, offset: int, *, max_bytes: int, max_wait_ms: int,
                  read_committed: bool = False, min_bytes: int = 1) -> FetchRequest:
    return FetchRequest(
        cluster_id=None, replica_id=BrokerId(-1), max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=max_wait_ms)),
        min_bytes=i32(min_bytes), max_bytes=i32(max_bytes), isolation_level=i8(1 if read_committed else 0),
        session_id=i32(0), session_epoch=i32(-1),
        topics=(FetchTopic(topic=TopicName(topic), partitions=(FetchPartition(
            partition=i32(partition), current_leader_epoch=i32(-1), fetch_offset=i64(offset),
            last_fetched_epoch=i32(-1), log_start_offset=i64(-1), partition_max_bytes=i32(max_bytes)),)),),
        forgotten_topics_data=(), rack_id="")


def parse_fetch_response(frame: bytes, topic: str, partition: int, offset: int, *,
                         wants_records: WantsRecords | None = None) -> FetchedPartition:
    """The one partition's answer of a Fetch v12 response frame (size prefix removed)."""
    try:
        body_offset = codec.skip_tagged_fields(frame, 4)  # correlation id, then the v1 header's tagged fields
        response, _size = read_entity(FetchResponse, frame, body_offset)
    except (SerialError, ProtocolError, ValueError, IndexError, OverflowError, struct.error) as exc:
        raise FetchFormatError(f"malformed Fetch response: {exc!r}") from None
    if response.error_code != ErrorCode.none:
        raise FetchError(int(response.error_code), f"Fetch failed: error {int(response.error_code)}")
    for topic_answer in response.responses:
        if topic_answer.topic != topic:
            continue
        for answer in topic_answer.partitions:
            if answer.partition_index != partition:
                continue
            if answer.error_code != ErrorCode.none:
                raise FetchError(int(answer.error_code),
                                 f"Fetch {topic}-{partition}@{offset}: error {int(answer.error_code)}")
            # the broker answers whole batches, so the first may start below `offset`; the caller fetches from
            # batch boundaries, so a batch wholly below `offset` is one already read
            batches = [b for b in parse_batches(bytes(answer.records or b""), wants_records=wants_records)
                       if b.last_offset >= offset]
            next_offset = max([offset] + [batch.last_offset + 1 for batch in batches])
            return FetchedPartition(int(answer.high_watermark), int(answer.last_stable_offset),
                                    int(answer.log_start_offset), batches, next_offset)
    raise FetchFormatError(f"Fetch response without {topic}-{partition}")


class FetchFrame:
    """One partition's Fetch request frame, encoded once: each fetch patches the correlation id, the offset, the
    wait and the minimum bytes into a copy (kio's writer is pure Python; a tail fetches the same request shape
    again and again). The fields' places are found by encoding with marker values and checked to be unique."""

    _OFFSET, _WAIT, _MIN = 0x7EDC_BA98_7654_3210, 0x7EDC_BA97, 0x7EDC_BA96  # no topic name holds these bytes

    def __init__(self, client_id: str | None, topic: str, partition: int, *, max_bytes: int) -> None:
        request = fetch_request(topic, partition, self._OFFSET, max_bytes=max_bytes, max_wait_ms=self._WAIT,
                                min_bytes=self._MIN)
        self._template = codec.encode_request(0, client_id, request)
        self._offset_at = self._place(struct.pack(">q", self._OFFSET))
        self._wait_at = self._place(struct.pack(">i", self._WAIT))
        self._min_at = self._place(struct.pack(">i", self._MIN))

    def _place(self, marker: bytes) -> int:
        at = self._template.find(marker)
        if at < 0 or self._template.find(marker, at + 1) >= 0:
            raise ProtocolError(f"Fetch frame: a marker value found {self._template.count(marker)} times")
        return at

    def frame(self, correlation_id: int, offset: int, *, max_wait_ms: int, min_bytes: int) -> bytes:
        frame = bytearray(self._template)
        struct.pack_into(">i", frame, _CORRELATION_ID_AT, correlation_id)
        struct.pack_into(">q", frame, self._offset_at, offset)
        struct.pack_into(">i", frame, self._wait_at, max_wait_ms)
        struct.pack_into(">i", frame, self._min_at, min_bytes)
        return bytes(frame)

    async def fetch(self, client: KafkaClient, topic: str, partition: int, offset: int, *, max_wait_ms: int,
                    min_bytes: int, timeout_ms: int, wants_records: WantsRecords | None = None) -> FetchedPartition:
        """`fetch` with this frame (same topic and partition as it was made for)."""
        correlation_id = client.next_correlation_id()
        answer = await client.send_raw(self.frame(correlation_id, offset, max_wait_ms=max_wait_ms,
                                                  min_bytes=min_bytes),
                                       correlation_id, _FETCH, FETCH_VERSION, timeout_ms=timeout_ms)
        return parse_fetch_response(answer, topic, partition, offset, wants_records=wants_records)


_FETCH = 1
_CORRELATION_ID_AT = 8  # size, api key, api version, then the correlation id


async def fetch(client: KafkaClient, topic: str, partition: int, offset: int, *, max_bytes: int = 1 << 20,
                max_wait_ms: int = 0, read_committed: bool = False, timeout_ms: int | None = None,
                min_bytes: int = 1, wants_records: WantsRecords | None = None) -> FetchedPartition:
    """One Fetch of `topic`-`partition` from `offset` (read_uncommitted unless asked), on the partition leader's
    connection `client`: answered once `min_bytes` are there or after `max_wait_ms`."""
    request = fetch_request(topic, partition, offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms,
                            read_committed=read_committed, min_bytes=min_bytes)
    answer = await client.send(request, timeout_ms=(max_wait_ms + 30_000) if timeout_ms is None else timeout_ms,
                               raw=True)
    return parse_fetch_response(answer, topic, partition, offset, wants_records=wants_records)


async def tolerant_request(client: KafkaClient, body: Any, *, timeout_ms: int | None = None) -> Any:
    """Send a kio request; its response is decoded with protocol/tolerant.py's bounded reader, never kio's native
    one (a broker's array lengths are as untrusted as a client's). FetchFormatError when malformed."""
    api_key, version = int(body.__api_key__), int(body.__version__)
    answer = await client.send(body, timeout_ms=timeout_ms, raw=True)
    return tolerant_response(api_key, version, answer)


def tolerant_response(api_key: int, version: int, answer: bytes) -> Any:
    """A raw response frame (correlation id first) read as tolerant_request does. FetchFormatError when malformed."""
    try:
        offset = 4
        if apis.response_header_version(api_key, version) >= 1:
            offset = codec.skip_tagged_fields(answer, offset)
        response, _size = read_entity(apis.response_class(api_key, version), answer, offset)
    except (SerialError, ProtocolError, ValueError, IndexError, OverflowError, struct.error) as exc:
        raise FetchFormatError(f"malformed response to api {api_key} v{version}: {exc!r}") from None
    return response
