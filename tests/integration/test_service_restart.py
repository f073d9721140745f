"""The whole service as a user runs it: `coordinator serve` killed with SIGKILL and started again on the same
state topic gives back identical groups and offsets, and a member that keeps heartbeating is not rebalanced."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import uuid
from typing import Any

from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.errors import ConnectionClosed, RequestTimedOut
from coordinator.loadgen.formation import FormedMember, form_stable_group
from tests.support import service as e2e
from tests.support.wire import heartbeat, join, nested, request, sync

SESSION_MS = 30_000
GROUP = "orders-app"
SIMPLE_GROUP = "standalone-tool"


def service(bootstrap: str, state_topic: str, initial_delay_ms: int = 3000):  # type: ignore[no-untyped-def]
    return e2e.service(bootstrap, state_topic, f"group.initial.rebalance.delay.ms={initial_delay_ms}")


async def until_loaded(client: KafkaClient) -> Any:
    return await e2e.until_loaded(client, GROUP)


async def describe(client: KafkaClient) -> Any:
    return await e2e.describe(client, GROUP)


async def until_parked(observer: KafkaClient, member_id: str, timeout_s: float = 60) -> None:
    """Until the coordinator holds `member_id`'s JoinGroup (the group rebalancing with it as a member), asked on
    `observer`'s own connection (closed here): a join still on its way would not be answered by a shutdown."""
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            described = await describe(observer)
            if described.group_state == "PreparingRebalance" and member_id in [m.member_id for m in
                                                                                 described.members]:
                return
            assert time.monotonic() < deadline, ("the JoinGroup was never parked", described)
            await asyncio.sleep(0.05)
    finally:
        await observer.close()


def group_snapshot(described: Any) -> tuple[Any, ...]:
    members = sorted((m.member_id, m.client_id, m.client_host, bytes(m.member_metadata), bytes(m.member_assignment))
                     for m in described.members)
    return described.group_state, described.protocol_type, described.protocol_data, tuple(members)


async def commit(client: KafkaClient, group_id: str, generation_id: int, member_id: str,
                 offsets: dict[int, int]) -> list[int]:
    partition = nested(ApiKey.OFFSET_COMMIT, 8, "topics", "partitions")
    topic = nested(ApiKey.OFFSET_COMMIT, 8, "topics")(name="orders", partitions=tuple(
        partition(partition_index=p, committed_offset=o, committed_leader_epoch=3, committed_metadata=f"m{p}")
        for p, o in offsets.items()))
    response = await client.request(request(ApiKey.OFFSET_COMMIT, 8, group_id=group_id,
                                            generation_id_or_member_epoch=generation_id, member_id=member_id,
                                            group_instance_id=None, topics=(topic,)))
    return [p.error_code for t in response.topics for p in t.partitions]


async def fetch(client: KafkaClient, group_id: str) -> list[tuple[Any, ...]]:
    topic = nested(ApiKey.OFFSET_FETCH, 7, "topics")(name="orders", partition_indexes=(0, 1, 2))
    response = await client.request(request(ApiKey.OFFSET_FETCH, 7, group_id=group_id, topics=(topic,),
                                            require_stable=True))
    assert response.error_code == 0
    return [(p.partition_index, p.committed_offset, p.committed_leader_epoch, p.metadata, p.error_code)
            for t in response.topics for p in t.partitions]


async def form_group(port: int) -> tuple[FormedMember, FormedMember]:
    """Two members in one Stable generation, formed like real consumers (coordinator/loadgen): whoever misses the
    first generation rejoins, instead of relying on both joining inside the initial rebalance delay."""
    formed = await form_stable_group("127.0.0.1", port, GROUP, 2, session_ms=SESSION_MS)
    leader = next(m for m in formed if m.is_leader)
    follower = next(m for m in formed if not m.is_leader)
    assert leader.generation_id == follower.generation_id and leader.members == 2
    assert follower.assignment and leader.assignment != follower.assignment
    return leader, follower


async def keep_heartbeating(port_of: dict[str, int], member: Any, errors: list[int], stop: asyncio.Event) -> None:
    """Heartbeat every second like a client, reconnecting whenever the coordinator is gone."""
    client: KafkaClient | None = None
    while not stop.is_set():
        try:
            if client is None or client.is_closed:
                client = await KafkaClient.connect("127.0.0.1", port_of["port"], timeout_ms=2_000)
            response = await client.request(heartbeat(GROUP, member.generation_id, member.member_id))
            errors.append(response.error_code)
        except (OSError, ConnectionClosed, RequestTimedOut, asyncio.TimeoutError):
            client = None  # coordinator down or restarting
        await asyncio.sleep(1.0)
    if client is not None:
        await client.close()


async def test_sigkill_and_restart_keeps_groups_offsets_and_members(kafka_bootstrap: str) -> None:
    state_topic = f"__state-{uuid.uuid4().hex[:8]}"
    async with service(kafka_bootstrap, state_topic) as first:
        admin = await first.client()
        await until_loaded(admin)
        leader, follower = await form_group(first.port)
        a, b = leader.client, follower.client
        assert await commit(a, GROUP, leader.generation_id, leader.member_id, {0: 100, 1: 200}) == [0, 0]
        assert await commit(admin, SIMPLE_GROUP, -1, "", {2: 42}) == [0]
        before = group_snapshot(await describe(admin))
        offsets_before = await fetch(admin, GROUP), await fetch(admin, SIMPLE_GROUP)
        assert before[0] == "Stable" and len(before[3]) == 2
        assert offsets_before[0][:2] == [(0, 100, 3, "m0", 0), (1, 200, 3, "m1", 0)]

        port_of = {"port": first.port}
        stop = asyncio.Event()
        heartbeat_errors: list[int] = []
        beating = asyncio.create_task(keep_heartbeating(port_of, follower, heartbeat_errors, stop))
        await asyncio.sleep(1.5)
        first.process.send_signal(signal.SIGKILL)
        await first.process.wait()
        for client in (a, b, admin):
            await client.close()

    async with service(kafka_bootstrap, state_topic) as second:
        port_of["port"] = second.port
        admin = await second.client()
        after = group_snapshot(await until_loaded(admin))
        assert after == before
        assert (await fetch(admin, GROUP), await fetch(admin, SIMPLE_GROUP)) == offsets_before

        # the follower keeps heartbeating against the restarted coordinator: wait for a few of its answers (how
        # long that takes depends on the machine; how many answers arrive in a fixed time would too)
        beats_before = len(heartbeat_errors)
        deadline = time.monotonic() + 60
        while len(heartbeat_errors) < beats_before + 3:
            assert time.monotonic() < deadline, "no heartbeat reached the restarted coordinator"
            await asyncio.sleep(0.1)
        stop.set()
        await beating
        assert set(heartbeat_errors) == {0}, heartbeat_errors  # never REBALANCE_IN_PROGRESS or UNKNOWN_MEMBER_ID

        # the follower's SyncGroup in Stable returns the assignment stored before the crash, same generation
        b2 = await second.client()
        resynced = await sync(b2, GROUP, follower.generation_id, follower.member_id)
        assert resynced.error_code == 0
        assert bytes(resynced.assignment) == follower.assignment
        assert (await describe(admin)).group_state == "Stable"
        await b2.close()
        await admin.close()


async def test_sigterm_answers_a_parked_join_and_exits_cleanly(kafka_bootstrap: str) -> None:
    """In-flight requests get up to the shutdown grace (5 s) to finish; a JoinGroup parked longer is answered
    NOT_COORDINATOR (the client rediscovers), and the process exits 0."""
    state_topic = f"__state-{uuid.uuid4().hex[:8]}"
    async with service(kafka_bootstrap, state_topic, initial_delay_ms=60_000) as running:
        client = await running.client()
        await until_loaded(client)
        first = await join(client, GROUP, session_timeout_ms=SESSION_MS)
        assert first.error_code == 79  # MEMBER_ID_REQUIRED
        parked = asyncio.ensure_future(join(client, GROUP, first.member_id, session_timeout_ms=SESSION_MS))
        await until_parked(await running.client(), first.member_id)  # in the 60 s initial rebalance delay
        assert not parked.done()
        running.process.send_signal(signal.SIGTERM)
        answered = await asyncio.wait_for(parked, 15)
        assert answered.error_code == 16  # NOT_COORDINATOR
        assert await asyncio.wait_for(running.process.wait(), 30) == 0
        await client.close()


async def test_a_state_topic_with_another_partition_count_is_refused_with_a_clear_error(kafka_bootstrap: str) -> None:
    """The group → partition mapping depends on the count: serving with another one would split groups."""
    from confluent_kafka.admin import AdminClient, NewTopic

    state_topic = f"__state-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(state_topic, num_partitions=7, replication_factor=1,
                                  config={"cleanup.policy": "compact"})])[state_topic].result(30)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "coordinator.cli", "serve", "--listen", "127.0.0.1:0",
        "--bootstrap-server", kafka_bootstrap, "--state-topic", state_topic, "--event-topic", "",
        "--config", "offsets.topic.num.partitions=3",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1
    assert b"coordinator listening" not in stdout
    message = stderr.decode().splitlines()[-1]
    assert message.startswith("coordinator serve: could not start:") and "7" in message and "3" in message, message
