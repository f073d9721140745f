"""Timer benchmark: our timing wheel vs asyncio's `call_later` heap, in the same process and run.

  python -m bench.timer [--loop asyncio|uvloop] [--resets 300000] [--repeats 3] [--quick]

1. Heartbeat pattern: N members each hold a session deadline (45 s, Kafka's default session.timeout.ms);
   every heartbeat cancels the member's deadline and schedules a new one. Measured with 1k, 10k and 100k live
   timers, inside a running loop that yields every 1000 resets (so asyncio can compact its heap as it does in
   real use); the best of --repeats runs is kept.
2. Memory per live timer (tracemalloc, 100k timers): our task + entry vs asyncio's TimerHandle (+ its
   Context + heap slot). A shared callback and shared delay, as for a real session timeout.
3. Expiry lateness, 100k live timers on an otherwise idle loop:
     probe:     100k background deadlines at 45 s plus 2k probes due in 10..1000 ms
     all_fire:  100k timers all due in 1..2 s (50k expiries/s)
   lateness = time the callback ran - its expiration (our expirations are whole ms on the monotonic clock;
   asyncio's are the handle's `when`).
Bounded: about 30 s with the defaults on a 2-core machine.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import random
import sys
import time
import tracemalloc

from bench import run_and_print
from coordinator.timer import MonotonicClock, SystemTimer, TimerTask

SESSION_TIMEOUT_MS = 45_000
YIELD_EVERY = 1_000


class Deadline(TimerTask):
    __slots__ = ()

    def run(self) -> None:
        pass


def noop() -> None:
    pass


# -- 1. heartbeat pattern ---------------------------------------------------------------------------------

async def resets_ours(live: int, resets: int) -> float:
    timer = SystemTimer("bench", clock=MonotonicClock())
    timer.start()
    deadlines = [Deadline(SESSION_TIMEOUT_MS) for _ in range(live)]
    for deadline in deadlines:
        timer.add(deadline)
    add = timer.add
    started = time.perf_counter()
    done = 0
    while done < resets:
        for i in range(done, done + YIELD_EVERY):
            deadline = deadlines[i % live]
            deadline.cancel()
            add(deadline)
        done += YIELD_EVERY
        await asyncio.sleep(0)
    elapsed = time.perf_counter() - started
    await timer.close()
    return resets / elapsed


async def resets_asyncio(live: int, resets: int) -> float:
    loop = asyncio.get_running_loop()
    call_later = loop.call_later
    timeout_s = SESSION_TIMEOUT_MS / 1000
    handles = [call_later(timeout_s, noop) for _ in range(live)]
    started = time.perf_counter()
    done = 0
    while done < resets:
        for i in range(done, done + YIELD_EVERY):
            slot = i % live
            handles[slot].cancel()
            handles[slot] = call_later(timeout_s, noop)
        done += YIELD_EVERY
        await asyncio.sleep(0)
    elapsed = time.perf_counter() - started
    for handle in handles:
        handle.cancel()
    await asyncio.sleep(0)
    return resets / elapsed


# -- 2. memory ----------------------------------------------------------------------------------------------

async def memory_per_timer(count: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    timer = SystemTimer("bench-memory", clock=MonotonicClock())
    timeout_s = SESSION_TIMEOUT_MS / 1000
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    deadlines = [Deadline(SESSION_TIMEOUT_MS) for _ in range(count)]
    for deadline in deadlines:
        timer.add(deadline)
    ours = tracemalloc.get_traced_memory()[0] - base
    base = tracemalloc.get_traced_memory()[0]
    handles = [loop.call_later(timeout_s, noop) for _ in range(count)]
    theirs = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    for handle in handles:
        handle.cancel()
    await timer.close()
    await asyncio.sleep(0)
    # Both figures include the 8-byte slot of the list that keeps the objects alive.
    return {"ours_bytes": round(ours / count, 1), "asyncio_bytes": round(theirs / count, 1)}


# -- 3. lateness ---------------------------------------------------------------------------------------------

class Probe(TimerTask):
    __slots__ = ("due_ms", "sink")

    def __init__(self, delay_ms: int, due_ms: int, sink: list[float]) -> None:
        super().__init__(delay_ms)
        self.due_ms = due_ms
        self.sink = sink

    def run(self) -> None:
        self.sink.append(time.monotonic_ns() / 1e6 - self.due_ms)


async def lateness_ours(background: int, probe_delays_ms: list[int]) -> tuple[list[float], float]:
    clock = MonotonicClock()
    timer = SystemTimer("bench-lateness", clock=clock)
    timer.start()
    for _ in range(background):
        timer.add(Deadline(SESSION_TIMEOUT_MS))
    lateness: list[float] = []
    cpu_started = time.process_time()
    for delay_ms in probe_delays_ms:
        timer.add(Probe(delay_ms, clock.now_ms() + delay_ms, lateness))
    while len(lateness) < len(probe_delays_ms):
        await asyncio.sleep(0.05)
    cpu_s = time.process_time() - cpu_started
    await timer.close()
    return lateness, cpu_s


async def lateness_asyncio(background: int, probe_delays_ms: list[int]) -> tuple[list[float], float]:
    loop = asyncio.get_running_loop()
    handles = [loop.call_later(SESSION_TIMEOUT_MS / 1000, noop) for _ in range(background)]
    lateness: list[float] = []

    def probe(when: float) -> None:
        lateness.append((time.monotonic() - when) * 1000)

    cpu_started = time.process_time()
    for delay_ms in probe_delays_ms:
        when = loop.time() + delay_ms / 1000
        loop.call_at(when, probe, when)
    while len(lateness) < len(probe_delays_ms):
        await asyncio.sleep(0.05)
    cpu_s = time.process_time() - cpu_started
    for handle in handles:
        handle.cancel()
    return lateness, cpu_s


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)  # noqa: E731
    return {"p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": round(ordered[-1], 3),
            "min_ms": round(ordered[0], 3)}


async def lateness_case(name: str, background: int, probe_delays_ms: list[int]) -> dict:
    result = {}
    for impl, run in (("ours", lateness_ours), ("asyncio", lateness_asyncio)):
        gc.collect()
        samples, cpu_s = await run(background, probe_delays_ms)
        result[impl] = {**percentiles(samples), "cpu_s": round(cpu_s, 3)}
        print(f"lateness {name:9s} {impl:8s} {result[impl]}", flush=True)
    return result


# -- driver ----------------------------------------------------------------------------------------------

async def main(args: argparse.Namespace) -> dict:
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    heartbeat = {}
    for live in sizes:
        ours = max([await resets_ours(live, args.resets) for _ in range(args.repeats)])
        theirs = max([await resets_asyncio(live, args.resets) for _ in range(args.repeats)])
        heartbeat[str(live)] = {"ours_per_s": round(ours), "asyncio_per_s": round(theirs),
                                "ratio": round(ours / theirs, 2)}
        print(f"heartbeat resets, {live:>7,} live: ours {ours:>12,.0f}/s  asyncio {theirs:>12,.0f}/s  "
              f"x{ours / theirs:.2f}", flush=True)
    memory = await memory_per_timer(100_000)
    print(f"memory per live timer (100k): {memory}", flush=True)
    rng = random.Random(1)
    count = 20_000 if args.quick else 100_000
    lateness = {
        "probe": await lateness_case("probe", count, [rng.randint(10, 1_000) for _ in range(2_000)]),
        "all_fire": await lateness_case("all_fire", 0, [rng.randint(1_000, 2_000) for _ in range(count)]),
    }
    return {"bench": "timer", "loop": args.loop, "python": sys.version.split()[0], "resets": args.resets,
            "heartbeat": heartbeat, "memory_per_timer": memory, "lateness": lateness}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--resets", type=int, default=300_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    run_and_print(main(arguments), arguments.loop)
