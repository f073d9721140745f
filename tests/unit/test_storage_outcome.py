"""A state write's outcome reaches the waiting request in the call that settles it (coordinator/storage/outcome.py):
the producer's outcome settles the store's (RecordAppender), the store's settles the runtime's writes
(GroupRuntime._await_appended), with no loop turn in between: at a thousand members a loop turn is milliseconds.
A listener added to an outcome settled already runs a turn later, never inside the adding call; shutdown settles
a write whose append is in flight as a cancelled append, as before."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.group.modern.records import GroupEpochRecord
from coordinator.group.records import Record
from coordinator.group.result import Write
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore, StoreError
from coordinator.storage.appender import RecordAppender
from coordinator.storage.outcome import Outcome
from coordinator.storage.producer import KafkaRecord
from coordinator.storage.tombstones import TombstoneWriter
from coordinator.timer import ManualClock, SystemTimer
from protocol.error_codes import Errors

GROUP = "g"


# ---------------------------------------------------------------------------------------------- Outcome itself


async def test_a_listener_runs_in_the_call_that_settles_the_outcome() -> None:
    outcome: Outcome[int] = Outcome()
    heard: list[Any] = []
    outcome.on_settled(lambda done: heard.append(done.result()))
    outcome.on_settled(lambda done: heard.append("second"))
    outcome.set_result(7)
    assert heard == [7, "second"]  # before any loop turn
    assert await outcome == 7


async def test_a_failed_outcome_and_a_cancelled_one_tell_their_listeners_at_once() -> None:
    failed: Outcome[None] = Outcome()
    cancelled: Outcome[None] = Outcome()
    heard: list[Any] = []
    failed.on_settled(lambda done: heard.append(type(done.exception()).__name__))
    cancelled.on_settled(lambda done: heard.append(done.cancelled()))
    failed.set_exception(StoreError(Errors.NOT_ENOUGH_REPLICAS, "refused"))
    waiter = asyncio.ensure_future(cancelled)
    await asyncio.sleep(0)
    waiter.cancel()  # a task awaiting it, cancelled: cancels the outcome too
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert heard == ["StoreError", True]


async def test_a_listener_of_a_settled_outcome_runs_a_turn_later_not_in_the_adding_call() -> None:
    outcome: Outcome[int] = Outcome()
    outcome.set_result(1)
    heard: list[int] = []
    outcome.on_settled(lambda done: heard.append(done.result()))
    assert heard == []
    await asyncio.sleep(0)
    assert heard == [1]


async def test_a_failing_listener_does_not_keep_the_others_from_hearing() -> None:
    outcome: Outcome[None] = Outcome()
    heard: list[str] = []

    def broken(_: Outcome[None]) -> None:
        raise RuntimeError("a bug")
    outcome.on_settled(broken)
    outcome.on_settled(lambda _: heard.append("told"))
    outcome.set_result(None)
    assert heard == ["told"]


# ---------------------------------------------------------------------------------------------- the store's append


class HeldSender:
    """A RecordSender whose sends wait until the test settles them, as a transactional producer's do until their
    transaction's outcome (TransactionQueue.send returns an Outcome)."""

    def __init__(self) -> None:
        self.sent: list[Outcome[Any]] = []

    def send(self, records: Sequence[KafkaRecord], *, offsets: list[int] | None = None) -> asyncio.Future[Any]:
        outcome: Outcome[Any] = Outcome()
        self.sent.append(outcome)
        return outcome


async def test_the_stores_outcome_settles_in_the_call_that_settles_the_producers() -> None:
    appender = RecordAppender(TombstoneWriter(3_600), 1_000_000)
    sender = HeldSender()
    stored: Outcome[None] = Outcome()
    appender.append(sender, 0, [GroupEpochRecord(GROUP, 1, 0)], stored)
    [together] = set(appender.append_together(sender, 0, [[GroupEpochRecord("a", 1, 0)], [GroupEpochRecord("b", 1, 0)]]))
    sender.sent[0].set_result(None)
    sender.sent[1].set_result(None)
    assert stored.done() and stored.result() is None  # no loop turn between the two
    assert together.done() and together.result() is None


# ---------------------------------------------------------------------------------------------- the runtime


class HeldStore(InMemoryGroupStore):
    """The in-memory store, its appends answered when the test settles them, with Outcomes as the Kafka store's."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Outcome[None]] = []

    def append(self, partition: int, records: Sequence[Record]) -> asyncio.Future[None]:
        outcome: Outcome[None] = Outcome()
        self.held.append(outcome)
        return outcome


@pytest.fixture
async def runtime():  # type: ignore[no-untyped-def]
    clock = ManualClock(1_000_000)
    timer = SystemTimer("test", clock=clock, executor=lambda fn: fn())
    made = GroupRuntime(CoordinatorConfig(offsets_topic_num_partitions=1), timer, HeldStore(), clock)
    yield made
    await made.shutdown()
    await timer.close()


def appended(runtime: GroupRuntime) -> tuple[Write, asyncio.Future[Errors]]:
    write = Write(GROUP, [GroupEpochRecord(GROUP, 1, 0)])
    done = runtime.shard_for(GROUP).append(write)
    assert isinstance(done, asyncio.Future)
    return write, done


async def test_a_write_is_settled_in_the_call_that_brings_its_appends_outcome(runtime: GroupRuntime) -> None:
    write, done = appended(runtime)
    settled: list[Errors] = []
    write.then_also(settled.append)
    await asyncio.sleep(0)
    assert not done.done()
    store = runtime.store
    assert isinstance(store, HeldStore)
    store.held[0].set_result(None)
    assert settled == [Errors.NONE] and done.done() and done.result() == Errors.NONE  # no loop turn between


async def test_a_refused_append_settles_its_write_with_the_stores_error(runtime: GroupRuntime) -> None:
    _, done = appended(runtime)
    store = runtime.store
    assert isinstance(store, HeldStore)
    store.held[0].set_exception(StoreError(Errors.NOT_ENOUGH_REPLICAS, "refused"))
    assert done.done() and done.result() == Errors.NOT_ENOUGH_REPLICAS


async def test_shutdown_settles_a_write_whose_append_is_in_flight_as_a_cancelled_append(runtime: GroupRuntime
                                                                                        ) -> None:
    _, done = appended(runtime)
    await runtime.shutdown()
    assert done.done() and done.result() == Errors.COORDINATOR_NOT_AVAILABLE
