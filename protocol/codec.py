"""The kio adapter: request frames to kio request objects, kio response objects to frames (and the reverse,
for our client). With the hand codecs of the hottest messages (protocol.fastpath: Heartbeat;
protocol.group_fastpath: JoinGroup and SyncGroup, whose packers the two handlers call), the only code that decodes
and encodes message bodies, so nothing above the protocol package reads bytes.

Header layouts (Kafka's RequestHeader/ResponseHeader):
- request v1: api_key int16, api_version int16, correlation_id int32, client_id nullable int16-length string;
  v2 adds a tagged-field section. client_id stays a non-compact string even in v2.
- response v0: correlation_id int32; v1 adds a tagged-field section (one 0 byte when empty).
"""

from __future__ import annotations

import datetime
import io
import struct
from functools import cache
from typing import Any, Callable, NamedTuple

from kio.index import KioIndexError, UnknownAPIKey
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.serial.readers import Reader, read_unsigned_varint
from kio.serial.writers import Writer
from kio.static.protocol import Entity

from protocol import apis
from protocol.apis import ApiKey
from protocol.errors import CorruptRequest, ProtocolError, UnknownApiKey, UnsupportedVersion
from protocol.fastpath import pack_heartbeat_request, pack_heartbeat_response
from protocol.group_fastpath import JoinGroupFields, SyncGroupFields, new_tuple, read_join_group, read_sync_group
from protocol.tolerant import has_arrays, read_entity

_HEADER_PREFIX = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id length
_CORRELATION = struct.Struct(">i")
_SIZE_AND_CORRELATION = struct.Struct(">ii")
_ONE_MS = datetime.timedelta(milliseconds=1)


class RequestHeader(NamedTuple):  # a NamedTuple: built per request, and 3x cheaper than a frozen dataclass
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


class Request(NamedTuple):
    header: RequestHeader
    # A kio request payload of (header.api_key, header.api_version): one dataclass per API and version, whose
    # fields handlers read by name, so no one static type describes it (kio's Payload protocol has no fields).
    body: Any


# ---------------------------------------------------------------------------------------------- server side
# (Any below, as in Request.body: a kio payload of whichever API and version the frame or header names.)


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id): the fixed first 8 bytes, readable for any API and version."""
    if len(frame) < 8:
        raise CorruptRequest(f"frame of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id, _client_id_length = _HEADER_PREFIX.unpack_from(frame)
    return api_key, api_version, correlation_id


def decode_request(frame: bytes) -> Request:
    """Decode a request frame (size prefix removed).

    Decodes any (API, version) kio has a schema for: which ones are *served* is the server's decision, checked
    before this (coordinator/server/handlers SERVED_APIS). Raises UnknownApiKey / UnsupportedVersion for an API or
    version kio does not know, CorruptRequest otherwise: whatever a reader raises on these untrusted bytes (kio's
    SerialError, ValueError for an over-long varint, OverflowError for a duration past timedelta's range, ...)
    becomes CorruptRequest, so the only exceptions leaving here are ProtocolErrors. (The try costs nothing on the
    heartbeat path until something raises.) Bytes after the body are ignored, as Kafka's request parsing does:
    librdkafka 2.x sends three after an all-topics Metadata v12 request (AdminClient.list_topics).
    """
    try:
        if len(frame) < _HEADER_PREFIX.size:
            raise CorruptRequest(f"frame of {len(frame)} bytes is shorter than a request header")
        api_key, api_version, correlation_id, client_id_length = _HEADER_PREFIX.unpack_from(frame)
        flexible, body_class, native_reader = _spec(api_key, api_version, correlation_id)
        offset = _HEADER_PREFIX.size
        client_id = None
        if client_id_length >= 0:
            offset += client_id_length
            if offset > len(frame):
                raise CorruptRequest("client_id runs past the end of the frame")
            client_id = frame[_HEADER_PREFIX.size : offset].decode()
        elif client_id_length != -1:
            raise CorruptRequest(f"client_id length {client_id_length}")
        if flexible:
            offset = skip_tagged_fields(frame, offset)
        if native_reader is None:
            body, _size = read_entity(body_class, frame, offset)
        else:
            body, _size = _read_natively(native_reader, body_class, frame, offset)
        return Request(RequestHeader(api_key, api_version, correlation_id, client_id), body)
    except ProtocolError:
        raise
    except Exception as exc:
        raise CorruptRequest(_corruption(frame, exc)) from exc


_GroupRead = tuple[int, int, str | None, JoinGroupFields | SyncGroupFields]
_GROUP_READERS: dict[int, Callable[[bytes], _GroupRead | None]] = {ApiKey.JOIN_GROUP: read_join_group,
                                                                   ApiKey.SYNC_GROUP: read_sync_group}


def read_group_request(frame: bytes) -> Request | None:
    """A JoinGroup or SyncGroup request in its usual shape, read by hand (protocol.group_fastpath): its body is
    then a JoinGroupFields / SyncGroupFields, not a kio payload. None for any other request, and for one in an
    unusual shape: `decode_request` reads those (and says what is wrong with them)."""
    if len(frame) < _HEADER_PREFIX.size or frame[0]:
        return None
    reader = _GROUP_READERS.get(frame[1])
    read = None if reader is None else reader(frame)
    if read is None:
        return None
    api_version, correlation_id, client_id, fields = read
    # the NamedTuples built in C (group_fastpath.new_tuple): two per request of a rebalance
    return new_tuple(Request, (new_tuple(RequestHeader, (frame[1], api_version, correlation_id, client_id)), fields))


def _corruption(frame: bytes, exc: Exception) -> str:
    if len(frame) < _HEADER_PREFIX.size:
        return repr(exc)
    api_key, api_version = _HEADER_PREFIX.unpack_from(frame)[:2]
    return f"api_key={api_key} api_version={api_version}: {exc!r}"


_Spec = tuple[bool, type[Entity], "Reader[Any] | None"]  # Any: the payload class varies by (API, version)


def _spec(api_key: int, api_version: int, correlation_id: int) -> _Spec:
    """(flexible, kio class, native reader or None) of an (API, version), built once and kept."""
    spec = _SPECS.get((api_key, api_version))
    if spec is not None:
        return spec
    try:
        body_class = apis.request_class(api_key, api_version)
    except UnknownAPIKey:
        raise UnknownApiKey(f"unknown api_key={api_key} correlation_id={correlation_id}") from None
    except KioIndexError:
        raise UnsupportedVersion(f"api_key={api_key} api_version={api_version} has no schema") from None
    # kio's native array readers trust the peer's length prefix (see protocol.tolerant): no native reader for
    # schemas with arrays
    native_reader = None if has_arrays(body_class) else _reader(body_class)
    spec = _SPECS[(api_key, api_version)] = (bool(body_class.__flexible__), body_class, native_reader)
    return spec


def skip_tagged_fields(frame: bytes, offset: int) -> int:
    """Offset after a tagged-field section; the header defines no tags we use, so all are skipped."""
    if offset < len(frame) and frame[offset] == 0:  # the usual case: no tags
        return offset + 1
    try:
        count, size = read_unsigned_varint(frame, offset)
        offset += size
        for _ in range(count):
            _tag, size = read_unsigned_varint(frame, offset)
            offset += size
            length, size = read_unsigned_varint(frame, offset)
            offset += size + length
    except (SerialError, ValueError) as exc:  # ValueError: a varint longer than five bytes
        raise CorruptRequest(f"bad tagged-field section: {exc}") from exc
    if offset > len(frame):
        raise CorruptRequest("tagged field runs past the end of the frame")
    return offset


def _read_natively(reader: Reader[Any], body_class: type[Entity], frame: bytes, offset: int) -> tuple[Any, int]:
    try:
        return reader(frame, offset)
    except KeyError:
        # kio's native reader refuses tags it does not know; Kafka ignores them, and so do we.
        return read_entity(body_class, frame, offset)


@cache
def _reader(entity_class: type[Entity]) -> Reader[Any]:
    return entity_reader(entity_class)


@cache
def _writer(entity_class: type[Entity]) -> Writer[Any]:
    return entity_writer(entity_class)


_SPECS: dict[tuple[int, int], _Spec] = {}


def encode_response(header: RequestHeader, body: Any) -> bytes:
    """A complete response frame (size prefix included) answering `header` with the kio payload `body`, or
    `body` itself when a handler packed its frame by hand (bytes: protocol.group_fastpath)."""
    if type(body) is bytes:
        return body
    if header.api_key == ApiKey.HEARTBEAT:
        throttle = getattr(body, "throttle_time", None)  # v0 has none; timedelta(0) is falsy
        throttle_ms = throttle // _ONE_MS if throttle else 0
        return pack_heartbeat_response(header.api_version, header.correlation_id, body.error_code, throttle_ms)
    version = apis.response_header_version(header.api_key, header.api_version)
    return encode_response_frame(header.correlation_id, version, body)


def encode_response_frame(correlation_id: int, header_version: int, body: Any) -> bytes:
    """Frame `body` behind a response header of the given version (used for ApiVersions v0 fallbacks too)."""
    buffer = io.BytesIO()
    buffer.write(_SIZE_AND_CORRELATION.pack(0, correlation_id))
    if header_version >= 1:
        buffer.write(b"\x00")
    body_class: type[Entity] = type(body)
    _writer(body_class)(buffer, body)
    frame = buffer.getbuffer()
    struct.pack_into(">i", frame, 0, len(frame) - 4)
    del frame
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------- client side


def encode_request(correlation_id: int, client_id: str | None, body: Any) -> bytes:
    """A complete request frame for the kio request payload `body` (its class fixes API key and version)."""
    api_key, version = int(body.__api_key__), int(body.__version__)
    if api_key == ApiKey.HEARTBEAT:
        return pack_heartbeat_request(version, correlation_id, client_id, body.group_id, body.generation_id,
                                      body.member_id, getattr(body, "group_instance_id", None))
    buffer = io.BytesIO()
    buffer.write(b"\x00\x00\x00\x00")
    buffer.write(struct.pack(">hhi", api_key, version, correlation_id))
    if client_id is None:
        buffer.write(struct.pack(">h", -1))
    else:
        raw = client_id.encode()
        buffer.write(struct.pack(">h", len(raw)) + raw)
    if body.__flexible__:
        buffer.write(b"\x00")
    body_class: type[Entity] = type(body)
    _writer(body_class)(buffer, body)
    frame = buffer.getbuffer()
    struct.pack_into(">i", frame, 0, len(frame) - 4)
    del frame
    return buffer.getvalue()


def decode_response(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation_id, kio response payload) of a response frame (size prefix removed)."""
    (correlation_id,) = _CORRELATION.unpack_from(frame)
    offset = 4
    if apis.response_header_version(api_key, version) >= 1:
        offset = skip_tagged_fields(frame, offset)
    body_class = apis.response_class(api_key, version)
    body, _size = _reader(body_class)(frame, offset)
    return correlation_id, body


def response_correlation_id(frame: bytes) -> int:
    (correlation_id,) = _CORRELATION.unpack_from(frame)
    return int(correlation_id)
