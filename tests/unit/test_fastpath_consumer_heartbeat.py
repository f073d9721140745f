"""The hand reader and writer of ConsumerGroupHeartbeat (protocol.fastpath) against kio, the general codec: the
same values from the same bytes and the same bytes from the same values, v0 and v1; on hostile bytes the reader
never raises and never accepts what the general decoder would read differently or reject."""

from __future__ import annotations

import datetime
import struct
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import apis, codec
from protocol.apis import ApiKey
from protocol.errors import ProtocolError
from protocol.fastpath import (
    ConsumerGroupHeartbeatFields,
    OwnedTopicPartitions,
    pack_consumer_group_heartbeat_response,
    read_consumer_group_heartbeat,
)
from protocol.messages import build, error, item_class
from tests.support.hostile_bytes import hostile

VERSIONS = (0, 1)
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=140)  # long enough for 2-byte varints
short_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
int32 = st.integers(-(2**31), 2**31 - 1)
topic_ids = st.uuids() | st.just(uuid.UUID(int=0))
partition_lists = st.lists(int32, max_size=40)
owned_lists = st.none() | st.lists(st.tuples(topic_ids, partition_lists), max_size=5)
examples = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def request(version: int, group_id: str, member_id: str, epoch: int, instance_id: str | None, rack_id: str | None,
            rebalance_ms: int, names: list[str] | None, regex: str | None, assignor: str | None,
            owned: list[tuple[uuid.UUID, list[int]]] | None) -> object:
    cls = apis.request_class(ApiKey.CONSUMER_GROUP_HEARTBEAT, version)
    entry = item_class(cls, "topic_partitions")
    fields = dict(group_id=group_id, member_id=member_id, member_epoch=epoch, instance_id=instance_id,
                  rack_id=rack_id, rebalance_timeout=datetime.timedelta(milliseconds=rebalance_ms),
                  subscribed_topic_names=None if names is None else tuple(names), server_assignor=assignor,
                  topic_partitions=None if owned is None else tuple(
                      entry(topic_id=t, partitions=tuple(ps)) for t, ps in owned))
    if version >= 1:
        fields["subscribed_topic_regex"] = regex
    return build(cls, **fields)


def fields_of(body) -> ConsumerGroupHeartbeatFields:
    """A kio payload as the hand reader's fields."""
    owned = body.topic_partitions
    return ConsumerGroupHeartbeatFields(
        body.group_id, body.member_id, int(body.member_epoch), body.instance_id, body.rack_id,
        datetime.timedelta(milliseconds=body.rebalance_timeout // datetime.timedelta(milliseconds=1)),
        None if body.subscribed_topic_names is None else tuple(body.subscribed_topic_names),
        getattr(body, "subscribed_topic_regex", None), body.server_assignor,
        None if owned is None else tuple(
            OwnedTopicPartitions(tp.topic_id, tuple(int(p) for p in tp.partitions)) for tp in owned))


def agrees_with_general_decoder(frame: bytes, fast: tuple | None) -> None:
    if fast is None:
        return
    decoded = codec.decode_request(frame)  # must not raise: the hand reader accepted the frame
    header = decoded.header
    assert fast[:3] == (header.api_version, header.correlation_id, header.client_id)
    assert fast[3] == fields_of(decoded.body)


@examples
@given(version=st.sampled_from(VERSIONS), group_id=text, member_id=text, epoch=int32,
       instance_id=st.none() | short_text, rack_id=st.none() | short_text, rebalance_ms=int32,
       names=st.none() | st.lists(short_text, max_size=5), regex=st.none() | short_text,
       assignor=st.none() | short_text, owned=owned_lists, correlation_id=int32, client_id=st.none() | short_text)
def test_request_reads_as_kio_does(version, group_id, member_id, epoch, instance_id, rack_id, rebalance_ms, names,
                                   regex, assignor, owned, correlation_id, client_id):
    body = request(version, group_id, member_id, epoch, instance_id, rack_id, rebalance_ms, names, regex, assignor,
                   owned)
    frame = codec.encode_request(correlation_id, client_id, body)[4:]
    fast = read_consumer_group_heartbeat(frame)
    assert fast is not None
    assert fast == (version, correlation_id, client_id, fields_of(codec.decode_request(frame).body))


def test_steady_state_heartbeat_reads_with_nulls():
    body = request(1, "g", "m", 5, None, None, -1, None, None, None, None)
    fast = read_consumer_group_heartbeat(codec.encode_request(3, "c", body)[4:])
    assert fast == (1, 3, "c", ConsumerGroupHeartbeatFields("g", "m", 5, None, None,
                                                            datetime.timedelta(milliseconds=-1), None, None, None,
                                                            None))


@examples
@given(version=st.sampled_from(VERSIONS), group_id=text, member_id=text, epoch=int32, correlation_id=int32,
       client_id=st.none() | short_text, trailing=st.binary(max_size=3))
def test_steady_heartbeat_reads_as_kio_does(version, group_id, member_id, epoch, correlation_id, client_id,
                                            trailing):
    """Every field but the ids and the epoch null (the shape read with one comparison), bytes after the body
    ignored as the general decoder ignores them."""
    body = request(version, group_id, member_id, epoch, None, None, -1, None, None, None, None)
    frame = codec.encode_request(correlation_id, client_id, body)[4:] + trailing
    fast = read_consumer_group_heartbeat(frame)
    assert fast is not None
    assert fast == (version, correlation_id, client_id, fields_of(codec.decode_request(frame).body))


@examples
@given(version=st.sampled_from(VERSIONS), owned=owned_lists, steady=st.booleans(), data=st.data())
def test_reader_on_hostile_bytes(version, owned, steady, data):
    body = (request(version, "group", "member-1", 4, None, None, -1, None, None, None, None) if steady else
            request(version, "group", "member-1", 4, "instance", "rack", 45_000, ["a", "b"], "r.*", "uniform", owned))
    frame = hostile(bytes(codec.encode_request(7, "client", body)[4:]), data)
    agrees_with_general_decoder(bytes(frame), read_consumer_group_heartbeat(bytes(frame)))


@pytest.mark.parametrize("version", VERSIONS)
@given(data=st.binary(max_size=64))
@examples
def test_reader_never_raises_on_arbitrary_bytes(version, data):
    frame = struct.pack(">hhih", ApiKey.CONSUMER_GROUP_HEARTBEAT, version, 1, -1) + data
    try:
        fast = read_consumer_group_heartbeat(frame)
    except Exception as exc:  # noqa: BLE001 - the property is "never raises"
        pytest.fail(f"hand reader raised {exc!r}")
    agrees_with_general_decoder(frame, fast)


def test_tagged_fields_and_other_apis_are_left_to_the_general_decoder():
    body = request(1, "g", "m", 5, None, None, -1, None, None, None, None)
    frame = codec.encode_request(1, "c", body)[4:]
    tagged = frame[:-1] + b"\x01\x05\x01z"  # one unknown tag in the body's tag section
    assert read_consumer_group_heartbeat(tagged) is None
    assert fields_of(codec.decode_request(tagged).body) == read_consumer_group_heartbeat(frame)[3]
    assert read_consumer_group_heartbeat(struct.pack(">hh", ApiKey.HEARTBEAT, 4) + frame[4:]) is None
    assert read_consumer_group_heartbeat(struct.pack(">hh", ApiKey.CONSUMER_GROUP_HEARTBEAT, 2) + frame[4:]) is None


def test_lying_array_count_is_refused():
    body = request(1, "g", "m", 5, None, None, -1, None, None, None, [(uuid.uuid4(), [1])])
    frame = codec.encode_request(1, "c", body)[4:]
    owned_at = len(frame) - 1 - 1 - 4 - 1 - 16 - 1  # body tags, entry tags, partition, its count, topic id, count
    assert frame[owned_at] == 2  # one entry, compact
    huge = frame[:owned_at] + b"\xff\xff\xff\xff\x07" + frame[owned_at + 1:]  # 2**31 entries claimed
    assert read_consumer_group_heartbeat(huge) is None
    with pytest.raises(ProtocolError):
        codec.decode_request(huge)


@examples
@given(version=st.sampled_from(VERSIONS), correlation_id=int32, error_code=st.sampled_from([0, 15, 22, 25, 110]),
       message=st.none() | text, member_id=st.none() | text, epoch=int32, interval=int32, throttle=int32,
       assignment=st.none() | st.dictionaries(st.uuids(), st.lists(int32, max_size=300), max_size=6))
def test_response_packs_as_kio_does(version, correlation_id, error_code, message, member_id, epoch, interval,
                                    throttle, assignment):
    cls = apis.response_class(ApiKey.CONSUMER_GROUP_HEARTBEAT, version)
    assignment_class = item_class(cls, "assignment")
    partitions_class = item_class(assignment_class, "topic_partitions")
    kio_assignment = None if assignment is None else assignment_class(topic_partitions=tuple(
        partitions_class(topic_id=t, partitions=tuple(ps)) for t, ps in assignment.items()))
    body = build(cls, throttle_time=datetime.timedelta(milliseconds=throttle), error_code=error(error_code),
                 error_message=message, member_id=member_id, member_epoch=epoch,
                 heartbeat_interval=datetime.timedelta(milliseconds=interval), assignment=kio_assignment)
    expected = codec.encode_response(
        codec.RequestHeader(ApiKey.CONSUMER_GROUP_HEARTBEAT, version, correlation_id, None), body)
    assert pack_consumer_group_heartbeat_response(correlation_id, error_code, message, member_id, epoch, interval,
                                                  assignment, throttle) == expected
