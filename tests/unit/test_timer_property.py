"""Property tests: the timer against a reference model, under a manual clock.

Random adds (fresh tasks and reschedules), cancels and clock moves (from 1 ms steps to jumps across every
level). After each step the timer must have fired exactly the model's due tasks, each once, at the first moment
the clock reached them; cancelled tasks never fire; `size` equals the model's count of pending tasks.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.timer import TimerTask
from coordinator.timer.testing import manual_timer, recording_task

delays = st.one_of(st.integers(0, 30), st.integers(0, 1_000), st.integers(0, 250_000))
moves = st.one_of(st.integers(0, 3), st.integers(0, 100), st.integers(0, 300_000))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), delays),
        st.tuples(st.just("reschedule"), st.integers(0, 10_000), delays),
        st.tuples(st.just("cancel"), st.integers(0, 10_000)),
        st.tuples(st.just("advance"), moves),
    ),
    min_size=10,
    max_size=150,
)


def check_against_model(steps, start_ms: int, tick_ms: int, wheel_size: int) -> None:
    timer, clock = manual_timer(start_ms=start_ms, tick_ms=tick_ms, wheel_size=wheel_size)
    fired: list[tuple[int, int]] = []
    tasks: list[TimerTask] = []
    pending: dict[int, int] = {}  # model: task index -> expiration_ms

    def is_due(expiration_ms: int) -> bool:
        # Kafka's rule: a task is due once the clock is in its tick (with tick 1: at its expiration).
        return expiration_ms // tick_ms <= clock.now_ms() // tick_ms

    for step in steps:
        fired.clear()
        kind = step[0]
        if kind == "add":  # a task's name is its index in `tasks`
            task = recording_task(step[1], len(tasks), clock, fired)
            pending[len(tasks)] = clock.now_ms() + step[1]
            tasks.append(task)
            timer.add(task)
        elif kind == "reschedule" and tasks:
            index = step[1] % len(tasks)
            task = tasks[index]
            task.delay_ms = step[2]
            timer.add(task)
            pending[index] = clock.now_ms() + step[2]
        elif kind == "cancel" and tasks:
            index = step[1] % len(tasks)
            tasks[index].cancel()
            pending.pop(index, None)
        elif kind == "advance":
            clock.advance(step[1])
            timer.advance_clock()
        due = sorted(i for i, expiration_ms in pending.items() if is_due(expiration_ms))
        assert sorted(name for name, _ in fired) == due, f"after {step}"
        for name, at_ms in fired:
            assert at_ms == clock.now_ms() and at_ms // tick_ms >= pending[name] // tick_ms
            del pending[name]
        assert timer.size == len(pending)


@settings(max_examples=300, deadline=None)
@given(steps=steps, start_ms=st.integers(0, 10**9), wheel_size=st.integers(2, 20))
def test_tick_1_fires_exactly_at_expiration(steps, start_ms, wheel_size):
    check_against_model(steps, start_ms, tick_ms=1, wheel_size=wheel_size)


@settings(max_examples=150, deadline=None)
@given(steps=steps, start_ms=st.integers(0, 10**9), tick_ms=st.sampled_from([2, 5, 10, 64]),
       wheel_size=st.integers(2, 20))
def test_coarser_ticks_fire_within_the_expiration_tick(steps, start_ms, tick_ms, wheel_size):
    check_against_model(steps, start_ms, tick_ms=tick_ms, wheel_size=wheel_size)


@settings(max_examples=100, deadline=None)
@given(delays_ms=st.lists(st.integers(0, 2_000), min_size=1, max_size=200), step_ms=st.integers(1, 7))
def test_every_task_fires_once_no_earlier_than_expiration_no_later_than_one_step(delays_ms, step_ms):
    timer, clock = manual_timer()
    fired: list[tuple[int, int]] = []
    for i, delay_ms in enumerate(delays_ms):
        timer.add(recording_task(delay_ms, i, clock, fired))
    while timer.size:
        clock.advance(step_ms)
        timer.advance_clock()
    assert sorted(name for name, _ in fired) == list(range(len(delays_ms)))
    for name, at_ms in fired:
        assert delays_ms[name] <= at_ms < delays_ms[name] + step_ms
