"""A static member replaced in a Stable group is written (its new member id) before the new member is answered;
when the real Kafka store refuses or fails that write, the group is left exactly as it was before the
replacement: the old member id, its protocols and timeouts, the static mapping, the leader, the state and the
record the group would write, and the old member goes on heartbeating."""

from __future__ import annotations

import asyncio

import pytest

from coordinator.group.metadata import GroupMetadata
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore
from protocol.error_codes import Errors
from tests.support.group_harness import Env, form_group, subscription
from tests.support.kafka_store import unique_topic

pytestmark = pytest.mark.integration

MAX_WRITE_BYTES = 4_000
ACK_WITHIN_S = 60  # a loaded 2-core machine


def picture(group: GroupMetadata) -> tuple:
    """Everything a failed replacement must leave as it was (live parked requests aside: there are none)."""
    members = {m.member_id: (m.group_instance_id, m.client_id, [(p.name, bytes(p.metadata)) for p in
                                                                m.supported_protocols],
                             m.rebalance_timeout_ms, m.session_timeout_ms, m.assignment, m.join_future, m.sync_future)
               for m in group.members.values()}
    return (group.state, group.generation_id, group.leader_id, group.protocol_type, group.protocol_name,
            dict(group.static_members), set(group.pending_members), group.num_members_awaiting_join,
            dict(group.supported_protocols), members,
            group.to_record({m.member_id: m.assignment for m in group.members.values()}))


@pytest.mark.parametrize("failure", ["write_too_large", "partition_not_loaded"])
async def test_a_failed_static_replacement_leaves_the_group_as_it_was(kafka_bootstrap: str, failure: str) -> None:
    store = KafkaGroupStore(StorageConfig(bootstrap=kafka_bootstrap, state_topic=unique_topic(), partitions=1,
                                          event_topic=None, max_write_bytes=MAX_WRITE_BYTES), load_timeout_ms=60_000)
    await store.start()
    env = Env(store=store, offsets_topic_num_partitions=1)
    try:
        await env.coordinator.load()
        a, s = env.client("a"), env.client("s", instance_id="is")
        await form_group(env, a, s, written_within_s=ACK_WITHIN_S)
        before = picture(env.group())
        if failure == "write_too_large":  # the store refuses the record before sending it: MESSAGE_TOO_LARGE
            topics = tuple(f"topic-with-a-long-name-{i:04}" for i in range(200))
            restarted = env.client("s", instance_id="is", protocols=[("range", subscription(*topics))])
            expected = Errors.UNKNOWN_SERVER_ERROR  # Kafka's answer to a group write of MESSAGE_TOO_LARGE
        else:  # the partition was given up in the store: NOT_COORDINATOR
            await store.unload([0])
            restarted = env.client("s", instance_id="is", session_timeout_ms=20_000)
            expected = Errors.NOT_COORDINATOR
        join = await restarted.start_join()
        response = await asyncio.wait_for(join, ACK_WITHIN_S)
        assert (response.error_code, response.member_id) == (expected, "")
        assert picture(env.group()) == before
        assert await s.heartbeat() == Errors.NONE  # the old member id is the member's again
        replaced = env.observer.of("replaced")
        assert [e[2:] for e in replaced] == [(s.member_id, replaced[0][3], "is"), (replaced[0][3], s.member_id, "is")]
    finally:
        await env.close()
        await store.close()
