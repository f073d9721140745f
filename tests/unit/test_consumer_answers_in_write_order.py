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
from typing import Any

from coordinator.group.member import ANSWERED_IN_PASS
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


class _Connection:
    """What a connection registers in ANSWERED_IN_PASS while its ConsumerGroupHeartbeat is parked: records when it
    is handed the answer (the write's `done` still unresolved: inside the write's settling)."""

    def __init__(self, write_done: asyncio.Future[Errors]) -> None:
        self.write_done = write_done
        self.answers: list[tuple[HeartbeatResponse, bool]] = []

    def answer_in_pass(self, future: asyncio.Future[Any], response: Any) -> None:
        future.set_result(response)
        self.answers.append((response, self.write_done.done()))


async def test_a_written_heartbeats_answer_is_handed_to_its_connection_in_the_writes_settling(env: Env) -> None:
    """A ConsumerGroupHeartbeat that wrote is answered in its write's settling through ANSWERED_IN_PASS, as a
    rebalance's JoinGroup/SyncGroup: its connection writes the answer then, not a loop turn later in the future's
    done callback (on the code before, the future's result was set and the connection never handed the answer)."""
    env.coordinator.consumer_groups.topics = StaticTopics([TopicImage(T, "t", 2)])
    store = env.store
    assert isinstance(store, InMemoryGroupStore)
    assert (await _join(env, "c")).error == Errors.NONE
    gate = store.hold_next_write()
    answer = env.coordinator.start_consumer_group_heartbeat(HeartbeatRequest(
        "g", "d", 0, rebalance_timeout_ms=30_000, subscribed_topic_names=("t",), owned=[], client_id="d",
        client_host="/127.0.0.1"))
    assert isinstance(answer, asyncio.Future)
    await drain()
    pending = env.coordinator.consumer_groups.unacknowledged("g")[0]
    assert pending is not None and pending.done is not None and not answer.done()
    connection = _Connection(pending.done)
    ANSWERED_IN_PASS[answer] = connection
    try:
        gate.set()
        await asyncio.wait_for(answer, 5)
    finally:
        ANSWERED_IN_PASS.pop(answer, None)
    assert [(response.error, written) for response, written in connection.answers] == [(Errors.NONE, False)]
