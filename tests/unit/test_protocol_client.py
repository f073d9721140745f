"""Our asyncio client: ApiVersions negotiation, pipelining with correlation ids, timeouts, one clean close."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.server.handlers import SERVED_APIS
from protocol.apis import ApiKey
from protocol.errors import ConnectionClosed, ProtocolError, RequestTimedOut
from tests.support.server import RunningServer
from tests.support.wire import heartbeat, join, join_with_member_id, ms, nested, request


async def test_connect_negotiates_the_servers_ranges() -> None:
    async with RunningServer() as env:
        client = await env.client()
        assert client.api_versions == {k: (a.min_version, a.max_version) for k, a in SERVED_APIS.items()}
        assert client.version_for(ApiKey.JOIN_GROUP, 5) == 5
        assert client.version_for(ApiKey.HEARTBEAT, 99) == 4
        with pytest.raises(ProtocolError):
            client.version_for(ApiKey.OFFSET_COMMIT, 1)  # we know v1, the server starts at v2


async def test_pipelined_requests_resolve_in_order_with_their_own_responses() -> None:
    async with RunningServer() as env:
        client = await env.client()
        joined = await join_with_member_id(client, "g")
        futures = [client.send(heartbeat("g", generation, joined.member_id)) for generation in (1, 7, 1, 9)]
        assert client.in_flight == 4
        codes = [int(response.error_code) for response in await asyncio.gather(*futures)]
        assert codes == [0, 22, 0, 22]  # NONE in CompletingRebalance (as Kafka), else ILLEGAL_GENERATION
        assert client.in_flight == 0


async def test_a_raw_send_gets_the_response_frame_in_its_place_among_decoded_ones() -> None:
    async with RunningServer() as env:
        client = await env.client()
        joined = await join_with_member_id(client, "g")
        decoded, raw = (client.send(heartbeat("g", 7, joined.member_id)),
                        client.send(heartbeat("g", 7, joined.member_id), raw=True))
        assert int((await decoded).error_code) == 22
        frame = await raw
        assert isinstance(frame, bytes)
        correlation_id = int.from_bytes(frame[:4], "big")
        assert correlation_id == client.next_correlation_id() - 1  # the raw request's own
        # a v4 Heartbeat answer: correlation id, header tags, throttle time, then the error code
        assert int.from_bytes(frame[9:11], "big", signed=True) == 22


async def test_a_timeout_fails_everything_outstanding_and_closes() -> None:
    async with RunningServer(shutdown_grace_ms=50) as env:
        leader = await env.client()
        joined = await join_with_member_id(leader, "g")
        sync_entry = nested(ApiKey.SYNC_GROUP, 5, "assignments")
        await leader.request(request(ApiKey.SYNC_GROUP, 5, group_id="g", generation_id=1, member_id=joined.member_id,
                                     group_instance_id=None, protocol_type="consumer", protocol_name="range",
                                     assignments=(sync_entry(member_id=joined.member_id, assignment=b""),)))
        newcomer = await env.client()
        first = await join(newcomer, "g")
        protocol = nested(ApiKey.JOIN_GROUP, 9, "protocols")(name="range", metadata=b"")
        parked = newcomer.send(request(ApiKey.JOIN_GROUP, 9, group_id="g", session_timeout=ms(6000),
                                       rebalance_timeout=ms(10000), member_id=first.member_id,
                                       group_instance_id=None, protocol_type="consumer", protocols=(protocol,),
                                       reason=None), timeout_ms=200)
        behind = newcomer.send(heartbeat("g", 1, joined.member_id))
        with pytest.raises(RequestTimedOut):
            await parked
        with pytest.raises(RequestTimedOut):
            await behind
        await asyncio.wait_for(newcomer.wait_closed(), 2)
        assert newcomer.is_closed
        with pytest.raises(ConnectionClosed):
            await newcomer.request(heartbeat("g", 1, joined.member_id))


async def test_close_fails_outstanding_requests_with_connection_closed() -> None:
    async with RunningServer(shutdown_grace_ms=50) as env:
        client = await env.client()
        await join_with_member_id(client, "g")
        newcomer = await env.client()
        first = await join(newcomer, "g")
        parked = newcomer.send(request(ApiKey.JOIN_GROUP, 9, group_id="g", session_timeout=ms(6000),
                                       rebalance_timeout=ms(10000), member_id=first.member_id,
                                       group_instance_id=None, protocol_type="consumer",
                                       protocols=(nested(ApiKey.JOIN_GROUP, 9, "protocols")(name="range",
                                                                                             metadata=b""),),
                                       reason=None))
        await asyncio.sleep(0.05)
        await newcomer.close()
        with pytest.raises(ConnectionClosed):
            await parked


async def test_server_going_away_fails_outstanding_requests() -> None:
    env = RunningServer(shutdown_grace_ms=50)
    async with env:
        client = await env.client()
        await env.server.close()
        with pytest.raises(ConnectionClosed):
            await client.request(heartbeat("g", 1, "m"))
