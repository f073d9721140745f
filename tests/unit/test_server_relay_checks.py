"""A connection of a coordinator that relays (coordinator/server/relaying.py) reads the relay's state for every
request it reads: whether an upstream link blocks it, whether relayed answers are due, where the request is
routed. Without a link (a group member's connection that never relayed anything) those are attribute reads and
one table lookup, not calls; these tests pin that the outcome is the relay's own in each case: reading paused
behind a parked request, a blocked link still holding requests back, a request the relay does not advertise still
refused as the relay refuses it, and an authorizer that does not enforce still allowing everything. Shortcuts of
the read path beside them: a request read alone leaves without the frame loop (a parked one with nothing to flush or
limit, one answered at once with its answer flushed), a parked one is answered without it when nothing waited
behind it, and a read that waits for a later turn checks only its bytes against the read limit; the listener's
all-idle event (what shutdown waits for) cleared once by the first parked request, not by each."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from coordinator.relay import Relay, RelayConfig
from coordinator.relay.versions import Route
from coordinator.security.authorizer import Acls, Authorizer, Operation, ResourceType
from coordinator.server.config import ServerConfig
from coordinator.server.connection import Connection
from coordinator.server.context import ConnectionContext, Node
from coordinator.server.handlers import served_ranges
from coordinator.server.handlers.api_versions import unsupported_version_reply
from coordinator.server.listener import CoordinatorServer
from coordinator.server.turns import turn_budget
from protocol.apis import ApiKey
from protocol.error_codes import Errors
from protocol.fastpath import pack_heartbeat_request, pack_heartbeat_response
from tests.support.connection_wire import (RecordingTransport, connected, join_frame, receive, stable_group_runtime,
                                          within_loop_turns)

MEMBERS = ("m-0", "m-1")  # m-0 leads
SESSION_MS = 30_000


class _Link:
    """An upstream link as a connection sees it: whether the broker takes requests."""

    node_id = 1

    def __init__(self) -> None:
        self.blocked = True

    def close(self) -> None: ...


@pytest.fixture
async def runtime() -> Any:
    async with stable_group_runtime(MEMBERS, SESSION_MS) as runtime:
        yield runtime


def _relay() -> Relay:
    """A relay as started against a cluster that serves every version we do (not connected: no broker known)."""
    relay = Relay(RelayConfig(), "127.0.0.1:9", served=served_ranges(), max_frame_bytes=ServerConfig().max_frame_bytes)
    relay.advertised = served_ranges()
    return relay


def _heartbeat(correlation_id: int, member_id: str = MEMBERS[1]) -> bytes:
    return pack_heartbeat_request(4, correlation_id, "client", "g", 1, member_id)



async def test_without_a_link_reading_pauses_behind_a_parked_join_and_resumes_once_answered(runtime: Any) -> None:
    server = CoordinatorServer(ServerConfig(max_buffered_bytes=2_048), runtime, relay=_relay())
    leader, leader_wire = connected(server)
    follower, _ = connected(server)
    receive(leader, join_frame(1, MEMBERS[0]))  # the leader rejoins: a rebalance, its JoinGroup parks for m-1
    assert leader.is_busy and leader._relaying is not None and leader._relaying.link is None
    beats = b"".join(_heartbeat(2 + i, MEMBERS[0]) for i in range(100))  # 3.3 KB behind the parked join
    receive(leader, beats)
    assert not leader_wire.reading and leader.buffered_bytes == len(beats) and leader_wire.writes == []
    receive(follower, join_frame(1, MEMBERS[1]))  # the join completes
    await within_loop_turns(lambda: leader_wire.reading)
    assert leader.buffered_bytes == 0 and not leader.is_busy
    (written,) = leader_wire.writes  # the JoinGroup's answer, then every heartbeat's, in one write
    assert written.endswith(b"".join(pack_heartbeat_response(4, 2 + i, Errors.ILLEGAL_GENERATION)  # (generation 2)
                                     for i in range(100)))


async def test_a_blocked_link_still_holds_requests_until_the_broker_takes_them_again(runtime: Any) -> None:
    server = CoordinatorServer(ServerConfig(), runtime, relay=_relay())
    connection, wire = connected(server)
    link = _Link()
    connection._relaying.link = link  # type: ignore[union-attr,assignment]
    receive(connection, _heartbeat(5))
    assert wire.writes == [] and connection.buffered_bytes > 0
    link.blocked = False
    connection.relay_blocked_changed()
    assert wire.writes == [pack_heartbeat_response(4, 5, Errors.NONE)] and connection.buffered_bytes == 0


async def test_what_the_relay_does_not_advertise_is_refused_as_the_relay_refuses_it(runtime: Any) -> None:
    relay = _relay()
    assert relay.routes[struct.pack(">hh", ApiKey.JOIN_GROUP, 9)] is Route.LOCAL
    relay.advertised = {key: versions for key, versions in served_ranges().items() if key != ApiKey.JOIN_GROUP}
    assert struct.pack(">hh", ApiKey.JOIN_GROUP, 9) not in relay.routes  # the table follows the advertised one
    server = CoordinatorServer(ServerConfig(), runtime, relay=relay)
    newer, newer_wire = connected(server)
    receive(newer, struct.pack(">ihhih", 10, ApiKey.API_VERSIONS, 99, 42, -1))  # KIP-511: answered
    assert newer_wire.writes == [unsupported_version_reply(42)] and not newer_wire.aborted
    joining, joining_wire = connected(server)
    receive(joining, join_frame(1, MEMBERS[1]))  # no longer advertised: closed (UnknownApiKey)
    assert joining_wire.aborted and joining_wire.writes == []


async def test_a_join_read_alone_parks_and_is_answered_without_the_frame_loop_as_one_answered_at_once(
        runtime: Any) -> None:
    server = CoordinatorServer(ServerConfig(), runtime, relay=_relay())
    leader, stranger = Connection(server), Connection(server)  # frame_loop_rounds: the frame loop's rounds
    leader_wire, stranger_wire = RecordingTransport(), RecordingTransport()
    leader.connection_made(leader_wire)  # type: ignore[arg-type]
    stranger.connection_made(stranger_wire)  # type: ignore[arg-type]
    receive(leader, join_frame(1, MEMBERS[0]))
    assert leader.is_busy and leader_wire.writes == [] and leader.frame_loop_rounds == 0
    receive(stranger, join_frame(7, "stranger"))  # UNKNOWN_MEMBER_ID at once: written in the same read
    (answer,) = stranger_wire.writes
    assert struct.unpack_from(">ih", answer, 9) == (0, Errors.UNKNOWN_MEMBER_ID)  # throttle, error (v9)
    assert not stranger.is_busy and stranger.frame_loop_rounds == 0  # (nor the frame loop for that)
    follower, _ = connected(server)
    receive(follower, join_frame(2, MEMBERS[1]))  # the join completes: the leader's answer, nothing behind it
    await within_loop_turns(lambda: bool(leader_wire.writes))
    (joined,) = leader_wire.writes
    assert struct.unpack_from(">ihi", joined, 9) == (0, Errors.NONE, 2)  # throttle, error, generation
    assert not leader.is_busy and leader.frame_loop_rounds == 0  # written without the frame loop


async def test_a_read_past_the_limit_waiting_for_the_next_turn_pauses_reading_until_handled(runtime: Any) -> None:
    server = CoordinatorServer(ServerConfig(max_buffered_bytes=2_048), runtime, relay=_relay())
    connection, wire = connected(server)
    budget = turn_budget()
    budget.spend(budget.left)  # this turn's budget spent: what is read now waits for a later turn
    beats = b"".join(_heartbeat(i) for i in range(100))  # 3.3 KB
    receive(connection, beats)
    assert not wire.reading and wire.writes == [] and connection.buffered_bytes == len(beats)
    await within_loop_turns(lambda: connection.buffered_bytes == 0 and wire.reading)
    assert b"".join(wire.writes) == b"".join(pack_heartbeat_response(4, i, Errors.NONE) for i in range(100))


async def test_the_listener_is_all_idle_exactly_while_no_connection_has_a_request_parked(runtime: Any) -> None:
    server = CoordinatorServer(ServerConfig(), runtime)
    (first, _), (second, _) = connected(server), connected(server)
    assert server._all_idle.is_set()
    server.parked(first)
    server.parked(second)
    assert not server._all_idle.is_set()
    server.unparked(first)
    assert not server._all_idle.is_set()
    server.unparked(second)
    assert server._all_idle.is_set()
    server.parked(second)
    assert not server._all_idle.is_set()


def test_an_authorizer_that_does_not_enforce_allows_everything_and_counts_no_refusal() -> None:
    authorizer = Authorizer()
    context = ConnectionContext(Node(0, "127.0.0.1", 9092, "c"), None,  # type: ignore[arg-type]
                                "/127.0.0.1", "127.0.0.1:1", authorizer=authorizer)
    assert context.allows(Operation.READ, ResourceType.GROUP, "g") and authorizer.refused == 0
    authorizer.use(Acls())  # the cluster has an authorizer and no ACL: denied
    assert not context.allows(Operation.READ, ResourceType.GROUP, "g") and authorizer.refused == 1
