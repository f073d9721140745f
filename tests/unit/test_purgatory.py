"""Purgatory unit tests under a manual clock: completion by key or by timeout, watch keys, purging."""
from __future__ import annotations

import asyncio
from collections import deque

import pytest

from coordinator.purgatory import CallbackOperation, DelayedOperationPurgatory
from coordinator.timer import ManualClock, SystemTimer

from coordinator.timer.testing import manual_timer


class Gate:
    """A delayed operation of the tests: `op`, the CallbackOperation the purgatory watches, completes when `ready`
    is set; its callbacks are recorded in order. (A class of the tests cannot subclass the compiled
    DelayedOperation: its parts are this object's methods, which a test's subclass overrides.)"""

    def __init__(self, delay_ms: int, ready: bool = False) -> None:
        self.ready = ready
        self.events: list[str] = []
        self.tries = 0
        self.op = CallbackOperation(delay_ms, lambda _op: self.try_complete(), lambda _op: self.on_complete(),
                                    lambda _op: self.on_expiration())

    def try_complete(self) -> bool:
        self.tries += 1
        return self.op.force_complete() if self.ready else False

    def on_complete(self) -> None:
        self.events.append("complete")

    def on_expiration(self) -> None:
        self.events.append("expire")

    @property
    def is_completed(self) -> bool:
        return self.op.is_completed

    def force_complete(self) -> bool:
        return self.op.force_complete()

    def run(self) -> None:
        self.op.run()


def make_purgatory(purge_interval: int = 1000) -> tuple[DelayedOperationPurgatory[CallbackOperation], SystemTimer, ManualClock]:
    timer, clock = manual_timer()
    return DelayedOperationPurgatory("test", timer, purge_interval), timer, clock


def test_completes_at_once_without_watching_or_timing():
    purgatory, timer, _ = make_purgatory()
    op = Gate(100, ready=True)
    assert purgatory.try_complete_else_watch(op.op, ["k"]) is True
    assert op.events == ["complete"] and purgatory.watched == 0 and timer.size == 0 and purgatory.delayed == 0


def test_second_try_after_watching_can_complete():
    purgatory, timer, _ = make_purgatory()

    class BecomesReady(Gate):
        def try_complete(self) -> bool:
            self.ready = self.tries >= 1  # false on the first try, true on the second
            return super().try_complete()

    op = BecomesReady(100)
    assert purgatory.try_complete_else_watch(op.op, ["k"]) is True
    assert op.tries == 2 and op.events == ["complete"] and timer.size == 0 and purgatory.delayed == 0


def test_completion_by_key():
    purgatory, timer, clock = make_purgatory()
    op = Gate(100)
    assert purgatory.try_complete_else_watch(op.op, ["member"]) is False
    assert purgatory.watched == 1 and purgatory.delayed == 1 and timer.size == 1
    assert purgatory.check_and_complete("member") == 0
    op.ready = True
    assert purgatory.check_and_complete("member") == 1
    assert op.events == ["complete"] and op.is_completed
    assert purgatory.watched == 0 and purgatory.watched_under("member") == 0
    assert timer.size == 0 and purgatory.delayed == 0
    clock.advance(200)
    timer.advance_clock()
    assert op.events == ["complete"]  # the timeout can no longer fire


def test_completion_by_timeout_runs_on_complete_then_on_expiration():
    purgatory, timer, clock = make_purgatory()
    op = Gate(100)
    purgatory.try_complete_else_watch(op.op, ["member"])
    clock.advance(99)
    timer.advance_clock()
    assert op.events == []
    clock.advance(1)
    timer.advance_clock()
    assert op.events == ["complete", "expire"] and purgatory.delayed == 0 and timer.size == 0
    op.ready = True
    assert purgatory.check_and_complete("member") == 0  # completed ops are only dropped
    assert purgatory.watched == 0


def test_force_complete_runs_on_complete_exactly_once():
    op = Gate(10)
    assert op.force_complete() is True
    assert op.force_complete() is False
    op.run()
    assert op.events == ["complete"]


def test_many_keys_op_completed_by_one_key_lingers_in_the_others_until_purged():
    purgatory, _, _ = make_purgatory()
    op = Gate(100)
    purgatory.try_complete_else_watch(op.op, ["a", "b", "c"])
    assert purgatory.watched == 3
    op.ready = True
    assert purgatory.check_and_complete("a") == 1
    assert purgatory.watched == 2 and purgatory.watched_under("b") == 1
    assert purgatory.check_and_complete("b") == 0       # already completed: dropped, not counted
    assert purgatory.watched == 1
    assert purgatory.purge_completed() == 1
    assert purgatory.watched == 0 and purgatory.watched_under("c") == 0


def test_purge_runs_by_itself_once_enough_operations_completed():
    purgatory, _, _ = make_purgatory(purge_interval=10)
    for i in range(12):
        op = Gate(100)
        purgatory.try_complete_else_watch(op.op, [f"own-{i}", "shared"])
        op.force_complete()  # completed elsewhere: both of its watcher entries are now garbage
    # The 12th watch saw 11 completed (> 10 and > 0 pending) and purged everything completed so far.
    assert purgatory.watched == 2
    assert purgatory.watched_under("shared") == 1


def test_no_unbounded_growth_over_a_million_completed_operations():
    purgatory, timer, _ = make_purgatory(purge_interval=1000)
    keys = [f"key-{i}" for i in range(100)]
    live: deque[Gate] = deque()
    peak_watched = 0
    for i in range(1_000_000):
        op = Gate(30_000)
        purgatory.try_complete_else_watch(op.op, (keys[i % 100], keys[(i * 7 + 1) % 100], keys[(i * 13 + 2) % 100]))
        live.append(op)
        if len(live) > 500:                 # keep ~500 pending; complete the oldest outside the purgatory
            live.popleft().force_complete()
        peak_watched = max(peak_watched, purgatory.watched)
    assert purgatory.delayed == 500 and timer.size == 500
    # Bounded by (purge threshold + pending) x 3 keys, far below the 3M entries a purge-free list would hold.
    assert peak_watched <= (1000 + 500 + 1) * 3


def test_cancel_for_key_cancels_without_completing():
    purgatory, timer, clock = make_purgatory()
    ops = [Gate(100) for _ in range(3)]
    for op in ops:
        purgatory.try_complete_else_watch(op.op, ["group"])
    assert purgatory.cancel_for_key("group") == [op.op for op in ops]
    assert purgatory.cancel_for_key("group") == []
    assert timer.size == 0 and purgatory.delayed == 0 and purgatory.watched == 0
    clock.advance(1000)
    timer.advance_clock()
    assert all(op.events == [] and not op.is_completed for op in ops)


def test_callbacks_may_watch_new_operations_under_the_key_being_checked():
    purgatory, _, _ = make_purgatory()
    successor = Gate(100)

    class Chaining(Gate):
        def on_complete(self) -> None:
            super().on_complete()
            purgatory.try_complete_else_watch(successor.op, ["member"])

    first = Chaining(100, ready=False)
    purgatory.try_complete_else_watch(first.op, ["member"])
    first.ready = True
    assert purgatory.check_and_complete("member") == 1
    assert purgatory.watched_under("member") == 1 and purgatory.watched == 1
    successor.ready = True
    assert purgatory.check_and_complete("member") == 1


def test_two_purgatories_sharing_one_timer_count_their_own_operations():
    timer, clock = manual_timer()
    heartbeat = DelayedOperationPurgatory("Heartbeat", timer, owns_timer=False)
    rebalance = DelayedOperationPurgatory("Rebalance", timer, owns_timer=False)
    heartbeat.try_complete_else_watch(Gate(10).op, ["m1"])
    heartbeat.try_complete_else_watch(Gate(10).op, ["m2"])
    rebalance.try_complete_else_watch(Gate(500).op, ["join-g"])
    assert (heartbeat.delayed, rebalance.delayed, timer.size) == (2, 1, 3)
    clock.advance(10)
    timer.advance_clock()
    assert (heartbeat.delayed, rebalance.delayed, timer.size) == (0, 1, 1)


def test_empty_keys_are_rejected():
    purgatory, _, _ = make_purgatory()
    with pytest.raises(ValueError):
        purgatory.try_complete_else_watch(Gate(10).op, [])


async def test_shutdown_cancels_everything_and_closes_the_timer():
    purgatory, timer, clock = make_purgatory()
    ops = [Gate(100) for _ in range(3)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op.op, [f"k{i}"])
    await purgatory.shutdown()
    assert purgatory.watched == 0 and purgatory.delayed == 0 and timer.size == 0
    clock.advance(1000)
    assert timer.advance_clock() is False
    assert all(op.events == [] for op in ops)


def test_purge_stays_amortised_with_many_pending_operations():
    """Kafka's rule alone would sweep all 20k x 3 pending entries every 1000 completions (≈ 60 entries
    visited per completion); requiring completed > pending keeps it to a few entries per completion."""

    timer, _ = manual_timer()
    purgatory: DelayedOperationPurgatory[CallbackOperation] = DelayedOperationPurgatory(
        "test", timer, purge_interval=1000)
    keys = [f"key-{i}" for i in range(100)]
    for i in range(20_000):  # pending for the whole test
        purgatory.try_complete_else_watch(Gate(60_000).op, (keys[i % 100], keys[(i + 1) % 100], keys[(i + 2) % 100]))
    completions = 100_000
    for i in range(completions):
        op = Gate(60_000)
        purgatory.try_complete_else_watch(op.op, (keys[i % 100], keys[(i + 3) % 100], keys[(i + 5) % 100]))
        op.force_complete()
    assert purgatory.swept_entries > 0, "completed operations must be purged at some point"
    assert purgatory.swept_entries <= 3 * 3 * completions
    assert purgatory.watched <= 3 * (20_000 + max(1000, 20_000) + 1)


def test_re_arming_under_the_same_key_drops_the_completed_predecessor_without_a_sweep():
    """A session's heartbeat operation is re-armed under its member key once per session: the completed one
    leaves as the new one joins, so no sweep over every key (which holds the loop at 300k members) is due."""

    timer, _ = manual_timer()
    purgatory: DelayedOperationPurgatory[CallbackOperation] = DelayedOperationPurgatory(
        "test", timer, purge_interval=10)
    ops = [Gate(60_000) for _ in range(100)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op.op, [("member", i)])
    for _session in range(5):
        for i, op in enumerate(ops):  # as GroupRuntime._check_session: the expired one re-arms at once
            op.force_complete()
            ops[i] = Gate(60_000)
            purgatory.try_complete_else_watch(ops[i].op, [("member", i)])
        assert purgatory.watched == 100 and purgatory.delayed == 100
    assert purgatory.sweeps == 0


async def test_a_sweep_on_the_loop_goes_a_batch_of_keys_per_callback():
    """A sweep over every key in one callback held the 300k-member soak's loop ~120 ms: on a running loop it goes
    PURGE_BATCH keys a callback, every completed entry gone at the end, requests served in between."""
    from coordinator.purgatory import purgatory as purgatory_module

    batch = purgatory_module.PURGE_BATCH
    keys = 5 * batch + 7
    purgatory, _, _ = make_purgatory(purge_interval=10)
    for i in range(keys):  # one pending operation per member key, for the whole test
        purgatory.try_complete_else_watch(Gate(60_000).op, [("member", i)])
    # one operation per member watched under the member's key and one of its own, completed elsewhere: garbage
    # in both lists until a sweep; the estimate crosses the pending count with the extra ones
    for key in [*(("member", i) for i in range(keys)), *(("extra", j) for j in range(3))]:
        op = Gate(60_000)
        purgatory.try_complete_else_watch(op.op, [key, ("own", key)])
        op.force_complete()
    assert purgatory.watched == keys + 2 * (keys + 3), "the sweep is not done within the call that asked for it"

    def swept() -> bool:
        return (all(purgatory.watched_under(("member", i)) == 1 for i in range(keys))
                and not any(purgatory.watched_under(("own", ("member", i))) for i in range(keys)))

    turns, largest_step = 0, 0
    while not swept():
        before = purgatory.watched
        await asyncio.sleep(0)
        turns += 1
        largest_step = max(largest_step, before - purgatory.watched)
        assert turns < 100, "the sweep must end"
    assert turns >= (2 * keys) // batch  # the member keys and their own keys, a batch a turn
    assert largest_step <= batch  # each key of a batch holds one garbage entry here
    assert purgatory.delayed == keys


async def test_shutdown_stops_a_sweep_in_progress():
    from coordinator.purgatory import purgatory as purgatory_module

    purgatory, _, _ = make_purgatory(purge_interval=10)
    keys = 2 * purgatory_module.PURGE_BATCH + 1
    for i in range(keys):
        purgatory.try_complete_else_watch(Gate(60_000).op, [("member", i)])
    for i in range(keys + 11):
        op = Gate(60_000)
        purgatory.try_complete_else_watch(op.op, [("member", i % keys), ("own", i)])
        op.force_complete()
    await purgatory.shutdown()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert purgatory.watched == 0 and purgatory.delayed == 0
