"""A ConsumerGroupHeartbeat answered from memory (it writes nothing) goes out when the group's write before it is
acknowledged, in that write's turn: before the answers of later writes acknowledged with it.

Kafka's runtime completes a request that wrote nothing at the commit of the last offset written before it, so a
partition's writes and answers go out in one order. Found by the simulator (seed 4100 of --protocol upgrade): a
member's join retried after a reset connection, answered from memory (epoch 5) while its join's write was in flight
through an outage, went out after the answer to the member's next heartbeat (epoch 6), written later and acknowledged
in the same batch. Manual clock, in-memory store (tests/support/group_harness.py)."""
from __future__ import annotations

import asyncio
import uuid

from coordinator.group.modern.heartbeat import HeartbeatRequest, HeartbeatResponse
from coordinator.group.store import InMemoryGroupStore
from coordinator.topics import StaticTopics, TopicImage
from protocol.error_codes import Errors
from tests.support.group_harness import Env, drain, env  # noqa: F401

T = uuid.UUID(int=0x7)


def _join(env: Env, member_id: str) -> asyncio.Task[HeartbeatResponse]:
    return asyncio.ensure_future(env.coordinator.consumer_group_heartbeat(HeartbeatRequest(
        "g", member_id, 0, rebalance_timeout_ms=30_000, subscribed_topic_names=("t",), owned=[],
        client_id=member_id, client_host="/127.0.0.1")))


async def test_an_answer_read_from_memory_goes_out_before_the_answers_of_later_writes(env: Env) -> None:
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 2)])
    store = env.store
    assert isinstance(store, InMemoryGroupStore)
    first_gate, second_gate = store.hold_next_write(), store.hold_next_write()
    answered: list[str] = []
    d_join = _join(env, "d")  # written: held
    await drain()
    writes = len(store.writes)
    d_again = _join(env, "d")  # the same join again (its answer lost with the connection): read from memory
    await drain()
    assert len(store.writes) == writes, "d's join again writes nothing"
    e_join = _join(env, "e")  # written after: held too
    await drain()
    assert not (d_join.done() or d_again.done() or e_join.done())
    for name, task in (("d", d_join), ("d again", d_again), ("e", e_join)):
        task.add_done_callback(lambda _, name=name: answered.append(name))
    first_gate.set()
    second_gate.set()  # both acknowledged in one loop turn
    await asyncio.gather(d_join, d_again, e_join)
    assert answered == ["d", "d again", "e"]
    assert d_again.result().member_epoch == d_join.result().member_epoch
