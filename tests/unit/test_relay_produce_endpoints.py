"""Produce v10+ answers through the relay: KIP-951 NodeEndpoints rewritten to our listeners, every other answer
left byte for byte, and a frame that does not parse refused."""

from __future__ import annotations

import datetime
import random
import uuid

import pytest

from coordinator.relay.produce_endpoints import endpoints_rewriter, rewrite_endpoints
from protocol import apis
from protocol.codec import decode_response, encode_response_frame
from protocol.messages import build, error, item_class

LISTENERS = {1: ("127.0.0.1", 40001), 2: ("127.0.0.1", 40002)}


def _response(version: int, *, moved: bool, record_error: bool = False) -> bytes:
    cls = apis.response_class(0, version)
    topic_class = item_class(cls, "responses")
    partition_class = item_class(topic_class, "partition_responses")
    error_class = item_class(partition_class, "record_errors")
    leader_class = item_class(partition_class, "current_leader")
    endpoint_class = item_class(cls, "node_endpoints")
    partitions = (
        build(partition_class, index=0, error_code=error(0), base_offset=41, log_append_time=None,
              log_start_offset=0, record_errors=(build(error_class, batch_index=0,
                                                       batch_index_error_message="bad"),) if record_error else (),
              error_message=None, current_leader=build(leader_class, leader_id=-1, leader_epoch=-1)),
        build(partition_class, index=1, error_code=error(6 if moved else 0), base_offset=-1, log_append_time=None,
              log_start_offset=-1, record_errors=(), error_message="moved" if moved else None,
              current_leader=build(leader_class, leader_id=2 if moved else -1, leader_epoch=7 if moved else -1)),
    )
    topic = (build(topic_class, topic_id=uuid.UUID(int=5), partition_responses=partitions)
             if version >= 13 else build(topic_class, name="orders", partition_responses=partitions))
    endpoints = (build(endpoint_class, node_id=2, host="broker-2.internal", port=9092, rack=None),
                 build(endpoint_class, node_id=3, host="broker-3.internal", port=9092, rack="r1")) if moved else ()
    body = build(cls, responses=(topic,), throttle_time=datetime.timedelta(0), node_endpoints=endpoints)
    return encode_response_frame(77, 1, body)


@pytest.mark.parametrize("version", [10, 11, 12, 13])
def test_an_answer_without_endpoints_is_relayed_as_it_is(version: int) -> None:
    frame = _response(version, moved=False, record_error=True)
    assert rewrite_endpoints(memoryview(frame), version, LISTENERS.get) is None


@pytest.mark.parametrize("version", [10, 11, 12, 13])
def test_endpoints_point_at_our_listeners_and_a_node_without_one_is_left_out(version: int) -> None:
    frame = _response(version, moved=True)
    rewritten = rewrite_endpoints(memoryview(frame), version, LISTENERS.get)
    assert rewritten is not None
    assert int.from_bytes(rewritten[:4], "big") == len(rewritten) - 4
    correlation_id, body = decode_response(0, version, rewritten[4:])
    assert correlation_id == 77
    assert [(int(n.node_id), n.host, int(n.port)) for n in body.node_endpoints] == [(2, "127.0.0.1", 40002)]
    moved = body.responses[0].partition_responses[1]
    assert int(moved.error_code) == 6 and int(moved.current_leader.leader_id) == 2


def test_versions_before_kip_951_are_not_looked_at() -> None:
    assert endpoints_rewriter(9, LISTENERS.get) is None
    assert endpoints_rewriter(10, LISTENERS.get) is not None


@pytest.mark.parametrize("cut", [1, 9, 30])
def test_a_truncated_or_padded_answer_is_refused(cut: int) -> None:
    frame = _response(12, moved=True)
    with pytest.raises(ValueError):
        rewrite_endpoints(memoryview(frame[:-cut]), 12, LISTENERS.get)
    with pytest.raises(ValueError):
        rewrite_endpoints(memoryview(frame + b"\x00"), 12, LISTENERS.get)


def test_a_corrupted_answer_is_either_relayed_rewritten_or_refused_never_a_crash() -> None:
    rng = random.Random(951)
    for version in (10, 12, 13):
        frame = bytearray(_response(version, moved=True, record_error=True))
        for _ in range(2_000):
            broken = bytearray(frame)
            for _ in range(rng.randint(1, 4)):
                broken[rng.randrange(8, len(broken))] = rng.randrange(256)
            try:
                rewritten = rewrite_endpoints(memoryview(broken), version, LISTENERS.get)
            except ValueError:
                continue
            assert rewritten is None or int.from_bytes(rewritten[:4], "big") == len(rewritten) - 4
