"""The steady ConsumerGroupHeartbeat's hand reader and writer (protocol.consumer_group_heartbeat) against kio, the
general codec: a steady request reads as kio reads it, any other shape is left to the other readers, hostile bytes
never raise and are never read differently from the general decoder; the answer is kio's bytes."""

from __future__ import annotations

import datetime
import struct
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import apis, codec
from protocol.apis import ApiKey
from protocol.consumer_group_heartbeat import pack_steady_answer, read_steady_heartbeat
from protocol.messages import ZERO_DURATION, build, error, item_class
from tests.support.hostile_bytes import hostile

VERSIONS = (0, 1)
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=140)  # long enough for 2-byte varints
short_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
int32 = st.integers(-(2**31), 2**31 - 1)
examples = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def request(version: int, group_id: str, member_id: str, epoch: int, *, instance_id: str | None = None,
            rack_id: str | None = None, rebalance_ms: int = -1, names: tuple[str, ...] | None = None,
            regex: str | None = None, assignor: str | None = None,
            owned: tuple[tuple[uuid.UUID, tuple[int, ...]], ...] | None = None) -> object:
    cls = apis.request_class(ApiKey.CONSUMER_GROUP_HEARTBEAT, version)
    entry = item_class(cls, "topic_partitions")
    fields = dict(group_id=group_id, member_id=member_id, member_epoch=epoch, instance_id=instance_id,
                  rack_id=rack_id, rebalance_timeout=datetime.timedelta(milliseconds=rebalance_ms),
                  subscribed_topic_names=names, server_assignor=assignor,
                  topic_partitions=None if owned is None else tuple(
                      entry(topic_id=t, partitions=ps) for t, ps in owned))
    if version >= 1:
        fields["subscribed_topic_regex"] = regex
    return build(cls, **fields)


def steady_fields(frame: bytes) -> tuple[object, ...] | None:
    """What the general decoder reads, in the hand reader's tuple, when the request is in the steady shape."""
    decoded = codec.decode_request(frame)
    body, header = decoded.body, decoded.header
    if (body.instance_id, body.rack_id, body.subscribed_topic_names, getattr(body, "subscribed_topic_regex", None),
            body.server_assignor, body.topic_partitions) != (None,) * 6 or body.rebalance_timeout != -1 * ONE_MS:
        return None
    return (header.api_version, header.correlation_id, header.client_id, body.group_id, body.member_id,
            int(body.member_epoch))


ONE_MS = datetime.timedelta(milliseconds=1)


@examples
@given(version=st.sampled_from(VERSIONS), group_id=text, member_id=text, epoch=int32, correlation_id=int32,
       client_id=st.none() | short_text, trailing=st.binary(max_size=3))
def test_steady_request_reads_as_kio_does(version, group_id, member_id, epoch, correlation_id, client_id, trailing):
    """Bytes after the body are ignored, as the general decoder ignores them."""
    frame = codec.encode_request(correlation_id, client_id, request(version, group_id, member_id, epoch))[4:]
    frame += trailing
    assert read_steady_heartbeat(frame) == steady_fields(frame) is not None


@examples
@given(version=st.sampled_from(VERSIONS), field=st.sampled_from(
    ["instance_id", "rack_id", "rebalance_ms", "names", "regex", "assignor", "owned"]), data=st.data())
def test_any_field_set_is_not_the_steady_shape(version, field, data):
    value = {"instance_id": short_text, "rack_id": short_text, "rebalance_ms": st.integers(0, 2**31 - 1),
             "names": st.lists(short_text, max_size=3).map(tuple), "regex": short_text, "assignor": short_text,
             "owned": st.lists(st.tuples(st.uuids(), st.lists(int32, max_size=3).map(tuple)),
                               max_size=2).map(tuple)}[field]
    if field == "regex" and version == 0:
        return  # v0 has no regex field
    body = request(version, "g", "m", 3, **{field: data.draw(value)})
    frame = codec.encode_request(1, "c", body)[4:]
    assert read_steady_heartbeat(frame) is None


@examples
@given(version=st.sampled_from(VERSIONS), data=st.data())
def test_reader_on_hostile_bytes(version, data):
    frame = hostile(bytes(codec.encode_request(7, "client", request(version, "group", "member-1", 4))[4:]), data)
    fast = read_steady_heartbeat(bytes(frame))
    if fast is not None:
        assert fast == steady_fields(bytes(frame))  # the general decoder reads it, and reads it the same


@pytest.mark.parametrize("version", VERSIONS)
@given(data=st.binary(max_size=64))
@examples
def test_reader_never_raises_on_arbitrary_bytes(version, data):
    frame = struct.pack(">hhih", ApiKey.CONSUMER_GROUP_HEARTBEAT, version, 1, -1) + data
    try:
        fast = read_steady_heartbeat(frame)
    except Exception as exc:  # noqa: BLE001 - the property is "never raises"
        pytest.fail(f"hand reader raised {exc!r}")
    if fast is not None:
        assert fast == steady_fields(frame)


def test_other_versions_apis_and_tagged_fields_are_left_to_the_other_readers():
    frame = codec.encode_request(1, "c", request(1, "g", "m", 5))[4:]
    assert read_steady_heartbeat(frame) == (1, 1, "c", "g", "m", 5)
    assert read_steady_heartbeat(frame[:-1] + b"\x01\x05\x01z") is None  # a tag in the body's tag section
    assert read_steady_heartbeat(struct.pack(">hh", ApiKey.HEARTBEAT, 1) + frame[4:]) is None
    assert read_steady_heartbeat(struct.pack(">hh", ApiKey.CONSUMER_GROUP_HEARTBEAT, 2) + frame[4:]) is None


@examples
@given(version=st.sampled_from(VERSIONS), correlation_id=int32, member_id=text, epoch=int32, interval=int32)
def test_answer_packs_as_kio_does(version, correlation_id, member_id, epoch, interval):
    cls = apis.response_class(ApiKey.CONSUMER_GROUP_HEARTBEAT, version)
    body = build(cls, throttle_time=ZERO_DURATION, error_code=error(0), error_message=None, member_id=member_id,
                 member_epoch=epoch, heartbeat_interval=datetime.timedelta(milliseconds=interval), assignment=None)
    expected = codec.encode_response(
        codec.RequestHeader(ApiKey.CONSUMER_GROUP_HEARTBEAT, version, correlation_id, None), body)
    assert pack_steady_answer(correlation_id, member_id, epoch, interval) == expected
