"""The server's transport-level behaviour (lent receive buffers, pausing reads, in-order responses, shutdown)
also holds on uvloop, the optional faster loop."""

from __future__ import annotations

import uvloop

from tests.unit import test_server_bad_input, test_server_connection


def test_pipelining_behind_a_parked_join_on_uvloop() -> None:
    uvloop.run(test_server_connection.test_pipelined_heartbeats_wait_behind_a_parked_join_and_come_back_in_order())


def test_back_pressure_on_uvloop() -> None:
    uvloop.run(test_server_connection.test_reading_stops_once_max_buffered_bytes_wait_behind_a_parked_request())


def test_graceful_shutdown_on_uvloop() -> None:
    uvloop.run(
        test_server_connection.test_shutdown_answers_parked_requests_then_closes_and_refuses_new_connections())


def test_a_two_gib_frame_is_contained_on_uvloop(caplog) -> None:
    uvloop.run(test_server_bad_input.test_bad_input_is_contained("2GiB-size", caplog))
