"""The deterministic simulator: its loop keeps virtual time and asyncio's ordering promises, a seed replays
exactly, a bounded number of seeds holds every invariant, and planted bugs in the production code are found."""
from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from typing import Any

import pytest

from coordinator.group.metadata import GroupMetadata
from coordinator.group.runtime import GroupRuntime
from coordinator.group.shard import GroupShard
from protocol.error_codes import Errors
from simulator.loop import SimulationStuck, VirtualLoop
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
def _first_failure(seeds: int) -> tuple[int, set[str]] | None:
    for seed in range(seeds):
        outcome = run_seed(seed)
        if not outcome.ok:
            return seed, {v.invariant for v in outcome.violations}
    return None


def test_answers_before_the_acknowledgement_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    async def written_at_once(self: GroupRuntime, done: list[asyncio.Future[Errors]]) -> list[Errors]:
        return [Errors.NONE] * len(done)

    monkeypatch.setattr(GroupRuntime, "_written", written_at_once)
    found = _first_failure(50)
    assert found is not None and "answer_after_ack" in found[1], found


def test_a_generation_that_is_not_bumped_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    bump = GroupMetadata.init_next_generation

    def init_without_bump(self: GroupMetadata, now_ms: int) -> None:
        bump(self, now_ms)
        if self.generation_id > 2:
            self.generation_id -= 1

    monkeypatch.setattr(GroupMetadata, "init_next_generation", init_without_bump)
    found = _first_failure(50)
    assert found is not None and found[1] & {"generation_once", "single_owner"}, found


def test_sessions_that_expire_early_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = GroupShard.schedule_heartbeat

    def two_thirds(self: GroupShard, group: Any, member: Any, timeout_ms: int) -> None:
        schedule(self, group, member, timeout_ms * 2 // 3)

    monkeypatch.setattr(GroupShard, "schedule_heartbeat", two_thirds)
    found = _first_failure(50)
    assert found is not None and "session_expiry" in found[1], found
