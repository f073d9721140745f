"""Connection churn against the whole service (in process, so the server's connection count can be read):
500 connections opened and closed — plain, mid-request, after a MEMBER_ID_REQUIRED, and while a JoinGroup is
parked. The connection count returns to its baseline and no ghost member or group stays behind.

Which Kafka rule removes a ghost: a new member parked in JoinGroup counts as alive (its deadline is the 300 s
new-member join timeout), so it stays until the join phase completes; then its JoinGroup response is dropped
and it must send SyncGroup within the rebalance timeout (DelayedSync) and heartbeat within its session timeout,
whichever comes first, or it is removed and the group rebalances. A KIP-394 pending member (MEMBER_ID_REQUIRED,
never rejoined) expires after its session timeout; an Empty group without offsets is removed by the next
offset-cleanup run."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from coordinator.app import ServiceOptions, running_service
from coordinator.config import CoordinatorConfig
from coordinator.server.config import ServerConfig
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.codec import encode_request
from protocol.errors import ConnectionClosed
from tests.support.service import describe, unique
from tests.support.wire import heartbeat, join, join_with_member_id, ms, nested, request, subscription_metadata, sync

GROUP = "churn-app"
GHOST_SESSION_MS = 1_500
GHOST_REBALANCE_MS = 2_000
MEMBER_SESSION_MS = 10_000
# the stable member's poll loop is busy during the churn (its heartbeats go on, it rejoins only afterwards): the
# join phase the parked ghosts start waits for it, however long the churn takes on a loaded machine
MEMBER_REBALANCE_MS = 60_000
PLAIN, MID_REQUEST, PENDING, PARKED = 300, 100, 50, 50
BATCH = 50
GROUPS = CoordinatorConfig(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=500,
                           offsets_topic_num_partitions=3, offsets_retention_check_interval_ms=1_000)
NONE, REBALANCE_IN_PROGRESS, MEMBER_ID_REQUIRED = 0, 27, 79


async def in_batches(count: int, make: Any) -> None:
    for start in range(0, count, BATCH):
        await asyncio.gather(*(make(i) for i in range(start, min(count, start + BATCH))))


class StableMember:
    """A well-behaved consumer: heartbeats, and rejoins and syncs (as leader) whenever told to."""

    def __init__(self, client: KafkaClient, member_id: str, generation: int) -> None:
        self.client, self.member_id, self.generation = client, member_id, generation

    async def keep_alive(self, client: KafkaClient) -> None:
        """Heartbeats only, on `client`, until cancelled: a consumer's heartbeat thread while its poll loop is
        busy (REBALANCE_IN_PROGRESS is left for the loop; the heartbeat still keeps the session)."""
        while True:
            response = await client.request(heartbeat(GROUP, self.generation, self.member_id), timeout_ms=5_000)
            assert response.error_code in (NONE, REBALANCE_IN_PROGRESS), response
            await asyncio.sleep(1.0)

    async def beat_once(self) -> None:
        response = await self.client.request(heartbeat(GROUP, self.generation, self.member_id), timeout_ms=5_000)
        if response.error_code == REBALANCE_IN_PROGRESS:
            joined = await join(self.client, GROUP, self.member_id, session_timeout_ms=MEMBER_SESSION_MS,
                                rebalance_timeout_ms=MEMBER_REBALANCE_MS)
            assert joined.error_code == NONE and joined.leader == self.member_id, joined
            self.generation = joined.generation_id
            assignment = {m.member_id: b"" for m in joined.members}
            synced = await sync(self.client, GROUP, self.generation, self.member_id, assignment)
            assert synced.error_code in (NONE, REBALANCE_IN_PROGRESS), synced
        else:
            assert response.error_code == NONE, response


async def test_500_connections_come_and_go_without_leaving_ghosts(kafka_bootstrap: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    options = ServiceOptions(server=ServerConfig(listen_host="127.0.0.1", listen_port=0), group=GROUPS,
                             bootstrap=kafka_bootstrap, state_topic=unique("__state"), event_topic=None)
    async with running_service(options) as service:
        await asyncio.wait_for(service.loaded.wait(), 60)
        port = service.server.port

        async def connect() -> KafkaClient:
            return await KafkaClient.connect("127.0.0.1", port, client_id="churn", timeout_ms=10_000)

        admin = await connect()
        a_client = await connect()
        first = await join_with_member_id(a_client, GROUP, session_timeout_ms=MEMBER_SESSION_MS,
                                          rebalance_timeout_ms=MEMBER_REBALANCE_MS)
        assert first.error_code == NONE
        assert (await sync(a_client, GROUP, first.generation_id, first.member_id,
                           {first.member_id: b""})).error_code == NONE
        member = StableMember(a_client, first.member_id, first.generation_id)
        baseline = service.server.connection_count
        assert baseline == 2

        async def plain(_: int) -> None:
            client = await connect()  # ApiVersions exchanged
            await client.close()

        async def mid_request(i: int) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = request(ApiKey.DESCRIBE_GROUPS, 5, groups=(GROUP,), include_authorized_operations=False)
            if i % 2:  # a first join of a group of its own, never read: a pending member in a new group
                frame = encode_request(1, "churn", _join_body("", f"{GROUP}-temp-{i}"))
            else:
                frame = encode_request(1, "churn", body)
            if i % 4 == 0:
                frame = frame[: len(frame) // 2]  # half a request, then gone
            writer.write(frame)
            await writer.drain()
            writer.close()

        async def pending(_: int) -> None:
            client = await connect()
            assert (await join(client, GROUP, session_timeout_ms=GHOST_SESSION_MS)).error_code == MEMBER_ID_REQUIRED
            await client.close()

        async def parked(_: int) -> None:
            client = await connect()
            first_join = await join(client, GROUP, session_timeout_ms=GHOST_SESSION_MS,
                                    rebalance_timeout_ms=GHOST_REBALANCE_MS)
            in_join = client.send(_join_body(first_join.member_id))
            await asyncio.sleep(0.2)
            assert not in_join.done()  # parked: the group waits for the stable member to rejoin
            await client.close()
            with pytest.raises(ConnectionClosed):
                await in_join  # the request is lost with its connection; the member stays until it expires

        started = time.monotonic()
        heartbeat_client = await connect()
        heartbeats = asyncio.ensure_future(member.keep_alive(heartbeat_client))
        await in_batches(PLAIN, plain)
        await in_batches(MID_REQUEST, mid_request)
        await in_batches(PENDING, pending)
        await in_batches(PARKED, parked)
        assert not heartbeats.done(), heartbeats.exception()
        heartbeats.cancel()
        await asyncio.gather(heartbeats, return_exceptions=True)
        await heartbeat_client.close()
        print(f"500 connections churned in {time.monotonic() - started:.1f} s")

        deadline = time.monotonic() + 60
        while True:
            await member.beat_once()
            described = await describe(admin, GROUP)
            if (described.group_state == "Stable" and [m.member_id for m in described.members] == [member.member_id]
                    and service.server.connection_count == baseline):
                break
            assert time.monotonic() < deadline, (described.group_state, len(described.members),
                                                 service.server.connection_count)
            await asyncio.sleep(0.3)

        group = service.coordinator.groups[GROUP]
        assert not group.pending_members and not group.pending_sync_members
        assert group.num_members_awaiting_join == 0
        # the temporary groups' pending members expire, and the Empty groups are cleaned up
        temp_deadline = time.monotonic() + GHOST_SESSION_MS / 1000 + 60
        while any(g.startswith(f"{GROUP}-temp-") for g in service.coordinator.groups):
            await member.beat_once()
            assert time.monotonic() < temp_deadline, sorted(service.coordinator.groups)
            await asyncio.sleep(0.5)
        listed = await admin.request(request(ApiKey.LIST_GROUPS, 4, states_filter=()))
        assert [g.group_id for g in listed.groups] == [GROUP]

        for client in (admin, a_client):
            await client.close()
        closing_started = time.monotonic()
    # nothing parked holds the shutdown grace (its expiry is logged); the bound only keeps a hang from passing
    assert time.monotonic() - closing_started < 30
    assert not [r for r in caplog.records if "handler_failed" in r.getMessage()
                or "shutdown_grace_expired" in r.getMessage()]
    messages = [r.getMessage() for r in caplog.records]
    # the parked ghosts were removed by session expiry after their join completed; the pending ones expired
    assert sum(f"in group {GROUP} has failed, removing it from the group" in m for m in messages) == PARKED
    assert sum(m.startswith("event=pending_member_expired") and f"group={GROUP} " in m for m in messages) == PENDING


def _join_body(member_id: str, group_id: str = GROUP) -> Any:
    protocol = nested(ApiKey.JOIN_GROUP, 9, "protocols")(name="range", metadata=subscription_metadata("t"))
    return request(ApiKey.JOIN_GROUP, 9, group_id=group_id, session_timeout=ms(GHOST_SESSION_MS),
                   rebalance_timeout=ms(GHOST_REBALANCE_MS), member_id=member_id, group_instance_id=None,
                   protocol_type="consumer", protocols=(protocol,), reason=None)
