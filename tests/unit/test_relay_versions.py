"""What the relay advertises and how it reads a Produce request's acks without decoding it."""

from __future__ import annotations

import pytest
from kio.schema.produce.v3.request import ProduceRequest as ProduceV3
from kio.schema.produce.v9.request import ProduceRequest as ProduceV9

from coordinator.relay.versions import Route, advertised_ranges, local_keys, produce_expects_response, route_of
from coordinator.server.handlers import served_ranges
from protocol.codec import encode_request
from protocol.messages import build

SERVED = served_ranges()
# a Kafka 4.1 broker's ranges for some keys
UPSTREAM = {0: (3, 12), 1: (4, 17), 2: (1, 10), 3: (0, 13), 8: (2, 10), 10: (0, 6), 11: (0, 9), 18: (0, 4),
            28: (0, 5), 55: (0, 2), 60: (0, 2), 68: (0, 1), 69: (0, 1), 76: (1, 1), 78: (1, 1), 36: (0, 2),
            17: (0, 1), 22: (0, 5), 25: (0, 4), 999: (0, 0)}


def test_group_apis_keep_our_ranges_and_rewritten_ones_are_intersected() -> None:
    table = advertised_ranges(UPSTREAM, SERVED)
    for key in local_keys(SERVED):
        assert table[key] == SERVED[key]
    assert table[3] == (0, 12)  # Metadata: ours stop at 12, the broker's at 13
    assert table[10] == (0, 6)
    assert table[25] == (0, 4) and route_of(25, local_keys(SERVED)) is Route.REWRITTEN  # AddOffsetsToTxn
    # KIP-848's APIs are ours because we serve them, never the cluster's (its coordinator must not see our groups)
    local = local_keys(SERVED)
    assert table[68] == table[69] == (0, 1) and route_of(68, local) is route_of(69, local) is Route.LOCAL
    # TxnOffsetCommit: the offsets go to our state partition, at Kafka 4.1's versions
    assert table[28] == (0, 5) and route_of(28, local) is Route.LOCAL


def test_apis_whose_responses_carry_addresses_are_capped_or_left_out() -> None:
    table = advertised_ranges(UPSTREAM, SERVED)
    assert table[0] == (3, 12)  # Produce v10+ NodeEndpoints are rewritten (v12: transaction version 2)
    assert table[1] == (4, 15)  # Fetch v16+ carries NodeEndpoints
    assert table[55] == (0, 1)  # DescribeQuorum v2 carries controller endpoints
    for absent in (60, 76, 78, 17, 36, 999):
        assert absent not in table, absent
    assert table[2] == (1, 10) and table[22] == (0, 5)


def test_routes() -> None:
    local = local_keys(SERVED)
    assert route_of(12, local) is Route.LOCAL and route_of(3, local) is Route.REWRITTEN
    assert route_of(1, local) is Route.RELAYED


def test_every_api_served_here_is_local_except_the_rewritten_ones() -> None:
    assert local_keys(SERVED) == frozenset(SERVED) - {3, 10, 25}
    assert {8, 9, 11, 12, 13, 14, 15, 16, 18, 42, 47} <= local_keys(SERVED)


@pytest.mark.parametrize("acks", [0, 1, -1])
@pytest.mark.parametrize("request_class", [ProduceV3, ProduceV9])
@pytest.mark.parametrize("transactional_id", [None, "tx-1"])
def test_produce_acks_are_read_from_the_raw_request(acks: int, request_class: type, transactional_id: str | None) -> None:
    import datetime

    body = build(request_class, transactional_id=transactional_id, acks=acks,
                 timeout=datetime.timedelta(milliseconds=1000), topic_data=())
    frame = encode_request(7, "client-x", body)
    assert produce_expects_response(frame) is (acks != 0)
    assert produce_expects_response(frame[4:], 0) is (acks != 0)
