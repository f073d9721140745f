"""The group coordinator on the Kafka-backed store: groups formed and offsets committed through the
coordinator's API survive into a fresh coordinator and store (§7.4), which answers
COORDINATOR_LOAD_IN_PROGRESS while loading and keeps loaded members without a rebalance."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from coordinator.group.api import (JoinGroupRequest, OffsetCommitRequest, OffsetCommitRequestPartition,
                                   OffsetCommitRequestTopic, OffsetFetchRequest)
from coordinator.group.runtime import GroupRuntime
from protocol.error_codes import Errors
from coordinator.group.state import GroupState
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore
from tests.support.group_harness import SESSION_MS, Client, Env, form_group

pytestmark = pytest.mark.integration


async def new_env(bootstrap: str, topic: str) -> Env:
    """A coordinator on a manual clock whose store is the real Kafka-backed one."""
    store = KafkaGroupStore(StorageConfig(bootstrap=bootstrap, state_topic=topic, partitions=4, event_topic=None),
                            load_timeout_ms=60_000)
    await store.start()
    return Env(store=store, offsets_topic_num_partitions=4)


async def close(env: Env) -> None:
    await env.close()
    await env.store.close()


async def form(env: Env, clients: list[Client]) -> None:
    await form_group(env, *clients, written_within_s=10)


async def commit(env: Env, client: Client, offsets: dict[int, int]) -> None:
    request = OffsetCommitRequest(client.group_id, client.generation, client.member_id, [OffsetCommitRequestTopic(
        "orders", [OffsetCommitRequestPartition(p, o, 3, f"meta-{p}") for p, o in offsets.items()])],
        client.instance_id)
    response = await asyncio.wait_for(env.coordinator.commit_offsets(request), 10)
    assert all(p.error_code == Errors.NONE for t in response.topics for p in t.partitions)


def snapshot(coordinator: GroupRuntime, group_id: str) -> dict:
    group = coordinator.groups[group_id]
    members = {m.member_id: (m.group_instance_id, m.client_id, m.client_host, m.session_timeout_ms,
                             m.rebalance_timeout_ms, bytes(m.assignment)) for m in group.members.values()}
    return {"state": group.state, "generation": group.generation_id, "leader": group.leader_id,
            "protocol": group.protocol_name, "protocol_type": group.protocol_type, "members": members}


async def fetched(coordinator: GroupRuntime, group_id: str) -> dict[int, tuple[int, int, str | None]]:
    response = await coordinator.fetch_offsets(OffsetFetchRequest(group_id, None))
    return {p.partition_index: (p.committed_offset, p.committed_leader_epoch, p.metadata)
            for t in response.topics for p in t.partitions}


async def test_groups_and_offsets_survive_into_a_fresh_coordinator(kafka_bootstrap: str) -> None:
    topic = f"__state-{uuid.uuid4().hex[:8]}"
    first = await new_env(kafka_bootstrap, topic)
    try:
        alpha = [first.client(f"a{i}", "alpha", instance_id="static-a0" if i == 0 else None) for i in range(3)]
        beta = [first.client("b0", "beta")]
        await form(first, alpha)
        await form(first, beta)
        await commit(first, alpha[0], {0: 10, 1: 11})
        await commit(first, alpha[1], {1: 21, 2: 22})  # partition 1: the later commit wins
        await commit(first, beta[0], {0: 5})
        assert await beta[0].leave() == Errors.NONE  # beta goes Empty: an empty-group record, next generation
        await first.advance(100)
        await first.store.flush()
        before = {g: snapshot(first.coordinator, g) for g in ("alpha", "beta")}
        offsets_before = {g: await fetched(first.coordinator, g) for g in ("alpha", "beta")}
    finally:
        await close(first)
    assert before["beta"]["state"] is GroupState.EMPTY and before["alpha"]["state"] is GroupState.STABLE

    second = await new_env(kafka_bootstrap, topic)
    try:
        loading = asyncio.ensure_future(second.coordinator.load())
        await asyncio.sleep(0)
        survivors = [rebind(c, second) for c in alpha]
        assert second.coordinator.is_loading
        probe = await second.coordinator.join_group(JoinGroupRequest("alpha", SESSION_MS, 30_000, "", None,
                                                                     "consumer", [], version=9))
        assert probe.error_code == Errors.COORDINATOR_LOAD_IN_PROGRESS
        assert await survivors[0].heartbeat() == Errors.NONE  # Heartbeat answers NONE while loading
        assert second.coordinator.is_loading and not loading.done()
        await asyncio.wait_for(loading, 60)
        after = {g: snapshot(second.coordinator, g) for g in ("alpha", "beta")}
        assert after == before
        assert {g: await fetched(second.coordinator, g) for g in ("alpha", "beta")} == offsets_before
        assert offsets_before["alpha"] == {0: (10, 3, "meta-0"), 1: (21, 3, "meta-1"), 2: (22, 3, "meta-2")}

        # loaded members got a fresh session: heartbeating members stay, without a rebalance
        await second.advance(SESSION_MS - 1_000)
        assert [await c.heartbeat() for c in survivors] == [Errors.NONE] * 3
        await second.advance(SESSION_MS - 1_000)
        assert [await c.heartbeat() for c in survivors[:2]] == [Errors.NONE] * 2
        assert snapshot(second.coordinator, "alpha")["generation"] == before["alpha"]["generation"]
        # the one that stopped heartbeating is removed after its session timeout, which starts a rebalance
        await second.advance(2_500)
        assert survivors[2].member_id not in second.coordinator.groups["alpha"].members
    finally:
        await close(second)


def rebind(client: Client, env: Env) -> Client:
    """The same consumer (member id, generation) now talking to another coordinator."""
    client.env = env
    return client
