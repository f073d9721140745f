"""Property test: random purgatory histories under a manual clock keep the purgatory's books straight.

Operations are watched under random keys, made ready and checked by key, force-completed from outside,
cancelled by key, and timed out by moving the clock. Invariants after every step: `on_complete` ran at most
once per operation (exactly once for completed ones), `on_expiration` only after it and only for operations
whose deadline passed; `watched` equals the watcher-list entries; `delayed` and `timer.size` equal the
operations still waiting in the timer; a checked key holds no completed operation.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.purgatory import CallbackOperation, DelayedOperationPurgatory
from coordinator.timer.testing import manual_timer

KEYS = ["a", "b", "c", "d", "e"]


class Op:
    """A test's delayed operation: `op`, the CallbackOperation the purgatory watches (a class of the tests cannot
    subclass the compiled DelayedOperation), completes when `ready` is set; its callbacks are recorded."""

    def __init__(self, delay_ms: int, clock) -> None:
        self.ready = False
        self.events: list[str] = []
        self.clock = clock
        self.deadline_ms = clock.now_ms() + delay_ms
        self.op = CallbackOperation(delay_ms, self._try_complete, self._on_complete, self._on_expiration)

    def _try_complete(self, op: CallbackOperation) -> bool:
        return op.force_complete() if self.ready else False

    def _on_complete(self, _op: CallbackOperation) -> None:
        self.events.append("complete")

    def _on_expiration(self, _op: CallbackOperation) -> None:
        assert self.clock.now_ms() >= self.deadline_ms
        self.events.append("expire")

    @property
    def is_completed(self) -> bool:
        return self.op.is_completed

    @property
    def is_scheduled(self) -> bool:
        return self.op.is_scheduled

    def force_complete(self) -> bool:
        return self.op.force_complete()


steps = st.lists(st.one_of(
    st.tuples(st.just("watch"), st.integers(0, 300), st.sets(st.sampled_from(KEYS), min_size=1, max_size=3),
              st.booleans()),
    st.tuples(st.just("ready"), st.integers(0, 10_000)),
    st.tuples(st.just("check"), st.sampled_from(KEYS)),
    st.tuples(st.just("force"), st.integers(0, 10_000)),
    st.tuples(st.just("cancel"), st.sampled_from(KEYS)),
    st.tuples(st.just("advance"), st.integers(0, 150)),
), min_size=20, max_size=100)


@settings(max_examples=300, deadline=None)
@given(steps=steps, purge_interval=st.integers(0, 5))
def test_random_histories_keep_the_books(steps, purge_interval):
    timer, clock = manual_timer()
    purgatory = DelayedOperationPurgatory("prop", timer, purge_interval)
    ops: list[Op] = []
    cancelled: set[int] = set()
    for step in steps:
        kind = step[0]
        if kind == "watch":
            op = Op(step[1], clock)
            op.ready = step[3]
            ops.append(op)
            assert purgatory.try_complete_else_watch(op.op, sorted(step[2])) is op.ready
        elif kind == "ready" and ops:
            ops[step[1] % len(ops)].ready = True
        elif kind == "check":
            purgatory.check_and_complete(step[1])
            assert all(not op.is_completed for op in purgatory._watchers.get(step[1], []))
        elif kind == "force" and ops:
            ops[step[1] % len(ops)].force_complete()
        elif kind == "cancel":
            cancelled.update(id(op) for op in purgatory.cancel_for_key(step[1]) if not op.is_completed)
        elif kind == "advance":
            clock.advance(step[1])
            timer.advance_clock()
        for op in ops:
            assert op.events in ([], ["complete"], ["complete", "expire"])
            assert op.is_completed == (op.events != [])
            if id(op.op) in cancelled:
                assert "expire" not in op.events  # out of the timer for good
        waiting = [op for op in ops if op.is_scheduled]
        assert purgatory.delayed == timer.size == len(waiting)
        assert all(not op.is_completed and id(op.op) not in cancelled for op in waiting)
        assert purgatory.watched == sum(len(v) for v in purgatory._watchers.values())
        assert all(purgatory._watchers.values())  # no empty lists left behind
        # Nothing waiting in the timer is overdue: the timer fired everything whose deadline passed.
        assert all(op.deadline_ms > clock.now_ms() for op in waiting)
