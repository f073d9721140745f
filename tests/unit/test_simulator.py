"""The deterministic simulator: its loop keeps virtual time and asyncio's ordering promises, a seed replays
exactly, a bounded number of seeds holds every invariant, and every planted bug (simulator/plants.py) is found."""
from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from typing import Any

import pytest

from simulator.loop import SimulationStuck, VirtualLoop
from simulator.plants import PLANTS
from simulator.run import run_seed

CI_SEEDS = int(os.environ.get("SIMULATOR_SEEDS", "200"))


def _run(loop: VirtualLoop, coro: Any) -> Any:
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


# --- the loop ------------------------------------------------------------------------------------------------
def test_virtual_time_jumps_to_the_next_timer() -> None:
    loop = VirtualLoop(random.Random(0))
    started = time.perf_counter()
    _run(loop, asyncio.sleep(3_600))
    assert loop.time() == 3_600
    assert time.perf_counter() - started < 1


def test_call_soon_keeps_its_order_and_simultaneous_timers_follow_the_seed() -> None:
    def order(seed: int) -> tuple[list[int], list[int]]:
        loop = VirtualLoop(random.Random(seed))
        soon: list[int] = []
        timers: list[int] = []

        async def main() -> None:
            for i in range(20):
                loop.call_soon(soon.append, i)
                loop.call_at(1.0, timers.append, i)
            await asyncio.sleep(2)

        _run(loop, main())
        return soon, timers

    soon, first = order(1)
    assert soon == list(range(20))
    assert sorted(first) == list(range(20))
    assert order(1)[1] == first  # the same seed, the same order
    assert any(order(seed)[1] != first for seed in range(2, 6))  # other seeds, other orders


def test_a_loop_with_nothing_to_wait_for_is_stuck_not_blocked() -> None:
    loop = VirtualLoop(random.Random(0))
    with pytest.raises(SimulationStuck):
        _run(loop, loop.create_future())


def test_executor_work_runs_inline_on_the_loop_thread() -> None:
    loop = VirtualLoop(random.Random(0))
    assert _run(loop, asyncio.to_thread(threading.get_ident)) == threading.get_ident()


# --- runs ----------------------------------------------------------------------------------------------------
def test_a_seed_replays_its_history_exactly() -> None:
    first, again, other = run_seed(11), run_seed(11), run_seed(12)
    assert first.digest == again.digest and first.events == again.events
    assert other.digest != first.digest


def test_seeds_hold_every_invariant() -> None:
    started = time.perf_counter()
    failing = [o for o in (run_seed(seed) for seed in range(CI_SEEDS)) if not o.ok]
    elapsed = time.perf_counter() - started
    print(f"{CI_SEEDS} seeds in {elapsed:.1f}s ({CI_SEEDS / elapsed:.1f} seeds/s)")
    assert not failing, "\n".join(f"seed {o.seed}: {o.violations[0].line()} "
                                  f"(replay: python -m simulator --seed {o.seed} --trace)" for o in failing)


# --- planted bugs: the whole pipeline can fail ---------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PLANTS))
def test_each_planted_bug_is_found(name: str) -> None:
    for seed in range(50):
        outcome = run_seed(seed, plant=name)
        if not outcome.ok:
            found = {v.invariant for v in outcome.violations}
            assert found & PLANTS[name].caught_by, (seed, found)
            return
    pytest.fail(f"planted bug {name} was not found in 50 seeds")


def test_a_plant_is_gone_after_its_run() -> None:
    assert run_seed(0, plant="answer_before_ack").violations
    assert run_seed(0).ok
