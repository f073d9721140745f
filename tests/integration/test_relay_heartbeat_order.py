"""On a relay connection (`coordinator serve`'s default) a Heartbeat v4 read alone takes the direct path
(Connection._sole_frame: answered from `buffer_updated` with one write) only while no relayed answer is due on
that connection: Kafka answers a connection's requests in the order sent, so a heartbeat answered here must never
overtake the answer to a request relayed before it. Through a real `CoordinatorServer` + `Relay` before the real
broker; a Fetch the broker holds (an empty partition, min_bytes 1) keeps a relayed answer due while the heartbeat
is read. Which path answered is seen by counting calls of the general path's heartbeat (`_heartbeat_v4`) and of
the answer both paths share (`_heartbeat_v4_answer`)."""

from __future__ import annotations

import asyncio
import collections
import datetime
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from coordinator.server.connection import Connection
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.codec import encode_request
from protocol.error_codes import Errors
from protocol.fastpath import pack_heartbeat_request, pack_heartbeat_response
from tests.support.polling import wait_until
from tests.support.relay import create_topic, partition_leaders
from tests.support.relayed_server import LIST_OFFSETS_NO_TOPICS, RelayedServer, relayed_server
from tests.support.server import RawPeer
from tests.support.service import unique
from tests.support.wire import join_with_member_id, nested, request, sync

pytestmark = pytest.mark.integration

HELD_MS = 3_000  # how long the broker holds the Fetch (nothing to read): the relayed answer is due that long
GENERAL, ANSWERED = "_heartbeat_v4", "_heartbeat_v4_answer"


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[str]]:
    """Calls of the general path's heartbeat and of the answer both paths give (the direct path: the second
    without the first)."""
    counted: collections.Counter[str] = collections.Counter()
    for name in (GENERAL, ANSWERED):
        original = getattr(Connection, name)

        def spy(self: Connection, frame: bytes, _name: str = name, _original: Any = original) -> Any:
            counted[_name] += 1
            return _original(self, frame)

        monkeypatch.setattr(Connection, name, spy)
    yield counted


class Member:
    """One classic member, joined and synced through the relay."""

    def __init__(self, group_id: str, generation_id: int, member_id: str) -> None:
        self.group_id, self.generation_id, self.member_id = group_id, generation_id, member_id

    def heartbeat(self, correlation_id: int) -> bytes:
        return pack_heartbeat_request(4, correlation_id, "order", self.group_id, self.generation_id, self.member_id)


async def _member(port: int, topic: str) -> Member:
    client = await KafkaClient.connect("127.0.0.1", port)
    try:
        group_id = unique("relay-heartbeat-order")
        joined = await join_with_member_id(client, group_id, topics=(topic,))
        assert joined.error_code == Errors.NONE
        synced = await sync(client, group_id, joined.generation_id, joined.member_id, {joined.member_id: b""})
        assert synced.error_code == Errors.NONE
        return Member(group_id, joined.generation_id, joined.member_id)
    finally:
        await client.close()


async def _leader_port(kafka_bootstrap: str, env: RelayedServer) -> tuple[str, int]:
    """A new one-partition topic, and our listener standing for its leader (where a Fetch of it is served)."""
    topic = unique("relay-heartbeat-order")
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic, 1)
    leader = -1
    for _ in range(100):  # bounded: a new partition has its leader within a few metadata rounds
        leader = (await asyncio.to_thread(partition_leaders, kafka_bootstrap, topic)).get(0, -1)
        if leader >= 0:
            break
        await asyncio.sleep(0.1)
    assert env.relay.listeners is not None
    port = env.relay.listeners.port_of(leader)
    assert port is not None
    return topic, port


def _fetch(correlation_id: int, topic: str) -> bytes:
    """Fetch v12 (relayed byte for byte) of the empty partition from offset 0: held by the broker for HELD_MS."""
    partition = nested(1, 12, "topics", "partitions")(partition=0, current_leader_epoch=-1, fetch_offset=0,
                                                       last_fetched_epoch=-1, log_start_offset=-1,
                                                       partition_max_bytes=1 << 20)
    entry = nested(1, 12, "topics")(topic=topic, partitions=(partition,))
    body = request(1, 12, replica_id=-1, max_wait=datetime.timedelta(milliseconds=HELD_MS), min_bytes=1,
                   max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1, topics=(entry,),
                   forgotten_topics_data=(), rack_id="")
    return encode_request(correlation_id, "order", body)


def _metadata(correlation_id: int, topic: str) -> bytes:
    """Metadata v12: answered here from the broker's answer (rewritten), the connection waiting meanwhile."""
    topics = (nested(ApiKey.METADATA, 12, "topics")(topic_id=None, name=topic),)
    body = request(ApiKey.METADATA, 12, topics=topics, allow_auto_topic_creation=False,
                   include_cluster_authorized_operations=False, include_topic_authorized_operations=False)
    return encode_request(correlation_id, "order", body)


def _list_offsets(correlation_id: int) -> bytes:
    frame = bytearray(LIST_OFFSETS_NO_TOPICS)
    struct.pack_into(">i", frame, 4, correlation_id)
    return struct.pack(">i", len(frame)) + bytes(frame)


def _correlation_id(frame: bytes) -> int:
    return int(struct.unpack_from(">i", frame)[0])


def _heartbeat_answer(correlation_id: int) -> bytes:
    return pack_heartbeat_response(4, correlation_id, Errors.NONE)[4:]  # as read_frame gives it: no size


async def _open(port: int) -> RawPeer:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return RawPeer(reader, writer)


async def test_heartbeats_on_a_relay_connection_take_the_direct_path(
        kafka_bootstrap: str, calls: collections.Counter[str]) -> None:
    async with relayed_server(kafka_bootstrap, "hb-direct") as env:
        topic, port = await _leader_port(kafka_bootstrap, env)
        member = await _member(port, topic)
        peer = await _open(port)
        try:
            await peer.send(_list_offsets(1))  # the link opened and used: a relay connection in its usual state
            assert _correlation_id(await peer.read_frame(10)) == 1
            calls.clear()
            for correlation_id in range(2, 7):  # one heartbeat per read, each answered before the next
                await peer.send(member.heartbeat(correlation_id))
                assert await peer.read_frame(10) == _heartbeat_answer(correlation_id)
            assert calls == {ANSWERED: 5}  # answered by the direct path, never by the general one
        finally:
            peer.close()


async def test_a_heartbeat_read_while_a_relayed_answer_is_due_is_answered_after_it(
        kafka_bootstrap: str, calls: collections.Counter[str]) -> None:
    async with relayed_server(kafka_bootstrap, "hb-order") as env:
        topic, port = await _leader_port(kafka_bootstrap, env)
        member = await _member(port, topic)
        peer = await _open(port)
        try:
            calls.clear()
            relayed_before = env.relay.counters.requests
            fetch_sent = time.monotonic()
            await peer.send(_fetch(1, topic))
            await wait_until(lambda: env.relay.counters.requests > relayed_before, 10, "the Fetch relayed")
            await peer.send(member.heartbeat(2))  # a read of its own, the Fetch's answer still due
            heartbeat_sent = time.monotonic()
            first = await peer.read_frame(HELD_MS / 1000 + 10)
            first_at = time.monotonic()
            second = await peer.read_frame(10)
            assert (_correlation_id(first), _correlation_id(second)) == (1, 2)  # in request order
            assert second == _heartbeat_answer(2)
            # the heartbeat really was read while the Fetch was held (else the order proves nothing)
            assert heartbeat_sent - fetch_sent < HELD_MS / 1000 / 2 <= first_at - fetch_sent
            assert calls == {GENERAL: 1, ANSWERED: 1}  # queued behind the relayed answer by the general path
            await peer.send(member.heartbeat(3))  # nothing due any more: the direct path again
            assert await peer.read_frame(10) == _heartbeat_answer(3)
            assert calls == {GENERAL: 1, ANSWERED: 2}
        finally:
            peer.close()


async def test_heartbeats_pipelined_with_relayed_and_rewritten_requests_are_answered_in_request_order(
        kafka_bootstrap: str) -> None:
    async with relayed_server(kafka_bootstrap, "hb-pipelined") as env:
        topic, port = await _leader_port(kafka_bootstrap, env)
        member = await _member(port, topic)
        peer = await _open(port)
        try:
            await peer.send(_list_offsets(1) + member.heartbeat(2) + _metadata(3, topic) + member.heartbeat(4)
                            + _fetch(5, topic) + member.heartbeat(6))  # one write
            answers = [await peer.read_frame(HELD_MS / 1000 + 10) for _ in range(6)]
            assert [_correlation_id(answer) for answer in answers] == [1, 2, 3, 4, 5, 6]
            assert [answers[i] for i in (1, 3, 5)] == [_heartbeat_answer(c) for c in (2, 4, 6)]
        finally:
            peer.close()
