"""The hand readers and writers of JoinGroup and SyncGroup (protocol.group_fastpath) against kio, the general
codec: the same values from the same bytes and the same bytes from the same values, for every served version;
and on hostile bytes (truncated, mutated, tagged) the hand readers never raise and never accept what the general
decoder would read differently or reject."""

from __future__ import annotations

import datetime
import random
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import apis, codec
from protocol.apis import ApiKey
from protocol.errors import ProtocolError
from protocol.group_fastpath import (
    JoinGroupFields,
    SyncGroupFields,
    join_group_fields,
    pack_join_group_response,
    pack_sync_group_request,
    pack_sync_group_response,
    read_join_group,
    read_sync_group,
    sync_group_fields,
)
from protocol.messages import build, error, item_class
from tests.fuzz.corpus import request_frame
from tests.fuzz.mutate import mutate
from tests.support.hostile_bytes import hostile

JOIN_VERSIONS = range(0, 10)
SYNC_VERSIONS = range(0, 6)
# strings as Kafka clients send them: any text without lone surrogates (not encodable), long enough for
# multi-byte varint lengths
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=140)
short_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
blob = st.binary(max_size=300)
int32 = st.integers(-(2**31), 2**31 - 1)
examples = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def join_request(version: int, group_id: str, session: int, rebalance: int, member_id: str,
                 instance_id: str | None, protocol_type: str, protocols: list[tuple[str, bytes]],
                 reason: str | None) -> object:
    cls = apis.request_class(ApiKey.JOIN_GROUP, version)
    entry = item_class(cls, "protocols")
    return build(cls, group_id=group_id, session_timeout=datetime.timedelta(milliseconds=session),
                 rebalance_timeout=datetime.timedelta(milliseconds=rebalance), member_id=member_id,
                 group_instance_id=instance_id, protocol_type=protocol_type,
                 protocols=tuple(entry(name=n, metadata=m) for n, m in protocols), reason=reason)


def sync_request(version: int, group_id: str, generation: int, member_id: str, instance_id: str | None,
                 protocol_type: str | None, protocol_name: str | None, assignments: list[tuple[str, bytes]]) -> object:
    cls = apis.request_class(ApiKey.SYNC_GROUP, version)
    entry = item_class(cls, "assignments")
    return build(cls, group_id=group_id, generation_id=generation, member_id=member_id,
                 group_instance_id=instance_id, protocol_type=protocol_type, protocol_name=protocol_name,
                 assignments=tuple(entry(member_id=m, assignment=a) for m, a in assignments))


join_fields_of, sync_fields_of = join_group_fields, sync_group_fields  # kio payload -> the hand reader's fields


def agrees_with_general_decoder(frame: bytes, fast: tuple | None, fields_of) -> None:
    """A hand reader's answer is either None (the general decoder's turn) or exactly what that decoder reads."""
    if fast is None:
        return
    request = codec.decode_request(frame)  # must not raise: the hand reader accepted the frame
    header = request.header
    assert fast[:3] == (header.api_version, header.correlation_id, header.client_id)
    assert fast[3] == fields_of(request.body)


@examples
@given(version=st.sampled_from(JOIN_VERSIONS), group_id=text, session=int32, rebalance=int32, member_id=text,
       instance_id=st.none() | short_text, protocol_type=short_text,
       protocols=st.lists(st.tuples(short_text, blob), max_size=4), reason=st.none() | text,
       correlation_id=int32, client_id=st.none() | short_text)
def test_join_group_request_reads_as_kio_does(version, group_id, session, rebalance, member_id, instance_id,
                                              protocol_type, protocols, reason, correlation_id, client_id):
    body = join_request(version, group_id, session, rebalance, member_id, instance_id, protocol_type, protocols,
                        reason)
    frame = codec.encode_request(correlation_id, client_id, body)[4:]
    fast = read_join_group(frame)
    assert fast is not None
    assert fast == (version, correlation_id, client_id, join_fields_of(codec.decode_request(frame).body))


@examples
@given(version=st.sampled_from(SYNC_VERSIONS), group_id=text, generation=int32, member_id=text,
       instance_id=st.none() | short_text, protocol_type=st.none() | short_text,
       protocol_name=st.none() | short_text, assignments=st.lists(st.tuples(text, blob), max_size=5),
       correlation_id=int32, client_id=st.none() | short_text)
def test_sync_group_request_reads_and_packs_as_kio_does(version, group_id, generation, member_id, instance_id,
                                                        protocol_type, protocol_name, assignments, correlation_id,
                                                        client_id):
    body = sync_request(version, group_id, generation, member_id, instance_id, protocol_type, protocol_name,
                        assignments)
    frame = codec.encode_request(correlation_id, client_id, body)
    fields = sync_fields_of(codec.decode_request(frame[4:]).body)
    assert read_sync_group(frame[4:]) == (version, correlation_id, client_id, fields)
    # the client-side packer writes kio's bytes (fields the version lacks are left out)
    assert pack_sync_group_request(version, correlation_id, client_id, *fields) == frame


@examples
@given(version=st.sampled_from(JOIN_VERSIONS), protocols=st.lists(st.tuples(short_text, blob), max_size=3),
       data=st.data())
def test_join_group_reader_on_hostile_bytes(version, protocols, data):
    body = join_request(version, "group", 10_000, 60_000, "member-1", "instance" if version >= 5 else None,
                        "consumer", protocols, "reason")
    frame = hostile(codec.encode_request(7, "client", body)[4:], data)
    agrees_with_general_decoder(frame, read_join_group(frame), join_fields_of)


@examples
@given(version=st.sampled_from(SYNC_VERSIONS), assignments=st.lists(st.tuples(short_text, blob), max_size=3),
       data=st.data())
def test_sync_group_reader_on_hostile_bytes(version, assignments, data):
    body = sync_request(version, "group", 3, "member-1", "instance", "consumer", "range", assignments)
    frame = hostile(codec.encode_request(7, "client", body)[4:], data)
    agrees_with_general_decoder(frame, read_sync_group(frame), sync_fields_of)


@pytest.mark.parametrize("reader,api_key", [(read_join_group, ApiKey.JOIN_GROUP),
                                            (read_sync_group, ApiKey.SYNC_GROUP)])
@given(data=st.binary(max_size=64))
@examples
def test_readers_never_raise_on_arbitrary_bytes(reader, api_key, data):
    frame = struct.pack(">hhih", api_key, 9 if api_key == ApiKey.JOIN_GROUP else 5, 1, -1) + data
    try:
        fast = reader(frame)
    except Exception as exc:  # noqa: BLE001 - the property is "never raises"
        pytest.fail(f"hand reader raised {exc!r}")
    if fast is not None:
        agrees_with_general_decoder(frame, fast, join_fields_of if api_key == ApiKey.JOIN_GROUP else sync_fields_of)


def test_lying_array_count_is_refused_without_allocation():
    body = sync_request(5, "g", 1, "m", None, "consumer", "range", [])
    frame = bytearray(codec.encode_request(1, "c", body)[4:])
    frame[-2] = 0xFF  # the assignments' compact count: now a varint that continues past the frame
    assert read_sync_group(bytes(frame)) is None
    huge = bytes(frame[:-2]) + b"\xff\xff\xff\xff\x07\x00"  # 2**31 elements claimed in a 1-byte remainder
    assert read_sync_group(huge) is None
    with pytest.raises(ProtocolError):
        codec.decode_request(huge)


@pytest.mark.parametrize("version", [6, 9])
def test_tagged_fields_leave_the_frame_to_the_general_decoder(version):
    body = join_request(version, "g", 10_000, 60_000, "m", None, "consumer", [("range", b"x")], None)
    frame = codec.encode_request(1, "c", body)[4:]
    tagged = frame[:-1] + b"\x01\x05\x01z"  # one unknown tag in the body's tag section
    assert read_join_group(tagged) is None
    assert join_fields_of(codec.decode_request(tagged).body) == read_join_group(frame)[3]


def test_other_apis_are_not_read():
    heartbeat = struct.pack(">hhih", ApiKey.HEARTBEAT, 4, 1, -1) + b"\x00\x02g\x00\x00\x00\x01\x02m\x00\x00"
    assert read_join_group(heartbeat) is None and read_sync_group(heartbeat) is None


@examples
@given(version=st.sampled_from(JOIN_VERSIONS), error_code=st.sampled_from([0, 15, 25, 27, 79]), generation=int32,
       protocol_type=st.none() | short_text, protocol_name=short_text, leader=text, skip=st.booleans(),
       member_id=text, members=st.lists(st.tuples(text, st.none() | short_text, blob), max_size=5),
       correlation_id=int32)
def test_join_group_response_packs_as_kio_does(version, error_code, generation, protocol_type, protocol_name,
                                               leader, skip, member_id, members, correlation_id):
    if version < 7 and protocol_type is not None:
        protocol_type = None  # not in these versions
    cls = apis.response_class(ApiKey.JOIN_GROUP, version)
    entry = item_class(cls, "members")
    expected = codec.encode_response(
        codec.RequestHeader(ApiKey.JOIN_GROUP, version, correlation_id, None),
        build(cls, throttle_time=datetime.timedelta(0), error_code=error(error_code), generation_id=generation,
              protocol_type=protocol_type, protocol_name=protocol_name, leader=leader, skip_assignment=skip,
              member_id=member_id, members=tuple(build(entry, member_id=m, group_instance_id=i, metadata=md)
                                                 for m, i, md in members)))
    packed = pack_join_group_response(version, correlation_id, error_code, generation, protocol_type,
                                      protocol_name, leader, skip, member_id, members)
    assert packed == expected


@examples
@given(version=st.sampled_from(SYNC_VERSIONS), error_code=st.sampled_from([0, 16, 22, 25, 27]),
       protocol_type=st.none() | short_text, protocol_name=st.none() | short_text, assignment=blob,
       correlation_id=int32)
def test_sync_group_response_packs_as_kio_does(version, error_code, protocol_type, protocol_name, assignment,
                                               correlation_id):
    expected = codec.encode_response(
        codec.RequestHeader(ApiKey.SYNC_GROUP, version, correlation_id, None),
        build(apis.response_class(ApiKey.SYNC_GROUP, version), throttle_time=datetime.timedelta(0),
              error_code=error(error_code), protocol_type=protocol_type, protocol_name=protocol_name,
              assignment=assignment))
    packed = pack_sync_group_response(version, correlation_id, error_code, protocol_type, protocol_name, assignment)
    assert packed == expected


@pytest.mark.parametrize("api_key,version", [(ApiKey.JOIN_GROUP, v) for v in JOIN_VERSIONS]
                         + [(ApiKey.SYNC_GROUP, v) for v in SYNC_VERSIONS])
def test_the_fuzzers_mutations_read_as_the_general_decoder_reads_them_or_not_at_all(api_key, version):
    """The mutation fuzzer's corpus frame (tests/fuzz) and 300 seeded mutations of it (forged and null lengths,
    over-long varints, bad UTF-8, unknown tags, truncation, bit flips, noise): the hand reader reads the frame
    itself, and every mutation either as the general decoder does or not at all."""
    reader, fields_of = ((read_join_group, join_fields_of) if api_key == ApiKey.JOIN_GROUP
                         else (read_sync_group, sync_fields_of))
    corpus = request_frame(api_key, version)
    assert reader(corpus.payload) is not None  # the usual shape is read by hand
    rng = random.Random(api_key * 100 + version)
    accepted = 0
    for _ in range(300):
        _name, mutated = mutate(corpus, rng)
        payload = mutated[4:]  # the size prefix is the framing's (a lie there never reaches a reader)
        fast = reader(payload)
        agrees_with_general_decoder(payload, fast, fields_of)
        accepted += fast is not None
    assert 0 < accepted < 300  # value mutations are read by hand; malformed ones are left to the general decoder


def _context(client_host: str) -> Any:
    """A connection's context as the handlers read it (a real one: compiled handlers check its type)."""
    from coordinator.server.context import ConnectionContext, Node

    return ConnectionContext(Node(0, "127.0.0.1", 9092, "test"), None, client_host, "peer")  # type: ignore[arg-type]


@pytest.mark.parametrize("rebalance_timeout_ms", [None, 45_000])
def test_the_handlers_build_the_requests_field_for_field(rebalance_timeout_ms: int | None) -> None:
    """The handlers build the group API's requests positionally: the same values as by keyword."""
    from coordinator.group import api
    from coordinator.server.handlers import join_group, sync_group
    from protocol.codec import RequestHeader

    ctx = _context("/10.0.0.1")
    join_fields = JoinGroupFields("g", 30_000, rebalance_timeout_ms, "m-1", "i-1", "consumer",
                                  [("range", b"\x00\x01"), ("sticky", b"")], "why")
    assert join_group.to_request(ctx, RequestHeader(11, 9, 1, "client"), join_fields) == api.JoinGroupRequest(
        group_id="g", session_timeout_ms=30_000,
        rebalance_timeout_ms=30_000 if rebalance_timeout_ms is None else rebalance_timeout_ms, member_id="m-1",
        group_instance_id="i-1", protocol_type="consumer",
        protocols=[api.JoinGroupProtocol("range", b"\x00\x01"), api.JoinGroupProtocol("sticky", b"")],
        reason="why", version=9, client_id="client", client_host="/10.0.0.1")
    for assignments in ([], [("m-1", b"a"), ("m-2", b"")]):
        sync_fields = SyncGroupFields("g", 7, "m-1", "i-1", "consumer", "range", assignments)
        assert sync_group.to_request(ctx, RequestHeader(14, 5, 2, None), sync_fields) == api.SyncGroupRequest(
            group_id="g", generation_id=7, member_id="m-1", group_instance_id="i-1", protocol_type="consumer",
            protocol_name="range", assignments=[api.SyncGroupRequestAssignment(m, a) for m, a in assignments],
            version=5, client_id="", client_host="/10.0.0.1")


def test_the_join_answer_is_built_field_for_field() -> None:
    """Group logic builds its JoinGroup answers positionally: the same values as by keyword."""
    from coordinator.group import api
    from coordinator.group.rebalance import Rebalancing
    from protocol.error_codes import Errors

    from coordinator.group.metadata import GroupMetadata
    from coordinator.group.observer import GroupObserver
    from coordinator.group.state import STABLE

    group = GroupMetadata("g", STABLE, 0, GroupObserver())
    group.generation_id, group.protocol_type, group.protocol_name, group.leader_id = 4, "consumer", "range", "m-1"
    members = [api.JoinGroupResponseMember("m-1", None, b"\x00")]
    assert Rebalancing.join_response(group, "m-2", members, leader="m-0", skip_assignment=True) == \
        api.JoinGroupResponse(Errors.NONE, member_id="m-2", generation_id=4, protocol_type="consumer",
                              protocol_name="range", leader="m-0", skip_assignment=True, members=members)
    assert Rebalancing.join_response(group, "m-1", []) == api.JoinGroupResponse(
        Errors.NONE, member_id="m-1", generation_id=4, protocol_type="consumer", protocol_name="range",
        leader="m-1", skip_assignment=False, members=[])


def test_the_hot_paths_tuples_are_their_named_types_field_for_field() -> None:
    """The reader, codec.read_group_request and the JoinGroup handler build their NamedTuples with tuple.__new__
    (group_fastpath.new_tuple, in C): the classes themselves, every field where its name says."""
    from coordinator.group import api
    from coordinator.server.handlers import join_group

    join = codec.encode_request(7, "client", join_request(9, "g", 30_000, 45_000, "m-1", "i-1", "consumer",
                                                          [("range", b"\x00\x01"), ("sticky", b"")], "why"))
    request = codec.read_group_request(join[4:])
    assert request is not None
    assert type(request) is codec.Request and type(request.header) is codec.RequestHeader
    assert request.header._asdict() == {"api_key": 11, "api_version": 9, "correlation_id": 7, "client_id": "client"}
    assert type(request.body) is JoinGroupFields
    assert request.body._asdict() == {
        "group_id": "g", "session_timeout_ms": 30_000, "rebalance_timeout_ms": 45_000, "member_id": "m-1",
        "group_instance_id": "i-1", "protocol_type": "consumer",
        "protocols": [("range", b"\x00\x01"), ("sticky", b"")], "reason": "why"}
    ctx = _context("/h")
    protocols = join_group.to_request(ctx, request.header, request.body).protocols
    assert [type(p) for p in protocols] == [api.JoinGroupProtocol] * 2
    assert [(p.name, p.metadata) for p in protocols] == [("range", b"\x00\x01"), ("sticky", b"")]
    sync = pack_sync_group_request(5, 8, None, "g", 3, "m-1", None, "consumer", "range", [("m-1", b"a")])
    read = codec.read_group_request(sync[4:])
    assert read is not None and type(read.body) is SyncGroupFields
    assert read.body._asdict() == {"group_id": "g", "generation_id": 3, "member_id": "m-1", "group_instance_id": None,
                                   "protocol_type": "consumer", "protocol_name": "range",
                                   "assignments": [("m-1", b"a")]}
