"""Purgatory benchmark after Kafka's TestPurgatoryPerformance, on one asyncio loop.

  python -m bench.purgatory [--loop asyncio|uvloop] [--rates 25000,50000,...] [--seconds 2] [--repeats 2]
                            [--quick]

Requests arrive as a Poisson process at a target rate (exponential inter-arrival times). Each is a delayed
operation with a 200 ms timeout, watched under 3 keys drawn from a space of 100. Its completion latency is
log-normal (given its 50th and 75th percentiles; sigma from 0.674490, the 75th percentile of N(0,1)); if that
latency is below the timeout a completer force-completes it then (as Kafka's CompletionQueue thread does, here
a heap drained by the generator on the same loop), otherwise the purgatory's timer expires it. Two cases, as
in Kafka's purgatory redesign: low timeout rate (pct50 20 ms, pct75 60 ms) and high timeout rate (pct50
200 ms, pct75 400 ms).

Each run issues rate x --seconds requests (best of --repeats runs by achieved rate) and reports the target
rate, the achieved enqueue rate, the time until every request completed, process CPU seconds (and per
request), the process's peak RSS so far, and the purgatory's peak sizes. The same purgatory is also run
with its timeouts on asyncio's `call_later` instead of the timing wheel, for comparison. The saturation
point is the highest target rate achieved within 5%.

Last, the heartbeat idiom of Kafka's group coordinator through the purgatory: 100k members, each heartbeat
completes the member's DelayedHeartbeat (checkAndComplete on its key) and watches a new one (45 s timeout).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import math
import random
import resource
import sys
import time
from typing import cast

from bench import run_and_print
from coordinator.purgatory import DelayedOperation, DelayedOperationPurgatory
from coordinator.timer import MonotonicClock, SystemTimer, TimerTask

TIMEOUT_MS = 200
KEYS_PER_REQUEST = 3
KEY_SPACE = 100
CASES = {"low_timeout": (20.0, 60.0), "high_timeout": (200.0, 400.0)}


class FakeOperation(DelayedOperation):
    __slots__ = ("completed_counter",)

    def __init__(self, delay_ms: int, completed_counter: list[int]) -> None:
        super().__init__(delay_ms)
        self.completed_counter = completed_counter

    def try_complete(self) -> bool:
        return False  # completed only by the completer or by the timeout, as in Kafka's benchmark

    def on_complete(self) -> None:
        self.completed_counter[0] += 1

    def on_expiration(self) -> None:
        pass


class _HandleLink:
    """Stands in for a TimerTaskEntry so that TimerTask.cancel() cancels an asyncio TimerHandle instead."""

    __slots__ = ("handle", "list", "timer")
    handle: asyncio.TimerHandle
    list: _HandleLink | None
    timer: CallLaterTimer

    def remove(self, link: _HandleLink) -> None:
        link.handle.cancel()
        link.list = None
        link.timer.size -= 1


class CallLaterTimer:
    """The obvious alternative: one `loop.call_later` per operation (asyncio's binary heap)."""

    def __init__(self) -> None:
        self.size = 0
        self._loop = asyncio.get_running_loop()

    def add(self, task: TimerTask) -> None:
        link = _HandleLink()
        link.list = link
        link.timer = self
        link.handle = self._loop.call_later(task.delay_ms / 1000, self._fire, task, link)
        task._entry = link  # type: ignore[assignment]
        self.size += 1

    def _fire(self, task: TimerTask, link: _HandleLink) -> None:
        link.list = None
        self.size -= 1
        task.run()

    async def close(self) -> None:
        pass


class DelayedHeartbeat(DelayedOperation):
    """Kafka's heartbeat idiom: each heartbeat completes the member's pending operation and watches a new one."""

    __slots__ = ("member",)

    def __init__(self, delay_ms: int, member: list[bool]) -> None:
        super().__init__(delay_ms)
        self.member = member  # [heartbeat received since this operation was created]

    def try_complete(self) -> bool:
        return self.force_complete() if self.member[0] else False

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        pass


async def heartbeats(timer_kind: str, members: int, beats: int) -> float:
    """Heartbeats/s through the purgatory, Kafka style (checkAndComplete, then tryCompleteElseWatch)."""
    timer: SystemTimer | CallLaterTimer
    if timer_kind == "wheel":
        timer = SystemTimer("bench-heartbeat", clock=MonotonicClock())
        timer.start()
    else:
        timer = CallLaterTimer()
    purgatory: DelayedOperationPurgatory[DelayedHeartbeat] = DelayedOperationPurgatory(
        "Heartbeat", cast(SystemTimer, timer))  # a CallLaterTimer stands in with the surface the purgatory uses
    keys = [(("group", f"member-{i}"),) for i in range(members)]
    flags = [[False] for _ in range(members)]
    for i in range(members):
        purgatory.try_complete_else_watch(DelayedHeartbeat(45_000, flags[i]), keys[i])
    started = time.perf_counter()
    for done in range(0, beats, 1_000):
        for n in range(done, done + 1_000):
            i = n % members
            flags[i][0] = True
            purgatory.check_and_complete(keys[i][0])
            flags[i] = [False]
            purgatory.try_complete_else_watch(DelayedHeartbeat(45_000, flags[i]), keys[i])
        await asyncio.sleep(0)
    rate = beats / (time.perf_counter() - started)
    assert purgatory.delayed == members
    await purgatory.shutdown()
    return rate


def latency_samples(rng: random.Random, pct50: float, pct75: float, count: int) -> list[float]:
    mu = math.log(pct50)
    sigma = (math.log(pct75) - mu) / 0.674490
    return [math.exp(rng.gauss(mu, sigma)) for _ in range(count)]


async def run_once(timer_kind: str, rate: float, count: int, pct50: float, pct75: float, seed: int) -> dict:
    rng = random.Random(seed)
    arrivals_ms, at_ms = [], 0.0
    for _ in range(count):
        at_ms += rng.expovariate(rate / 1000)
        arrivals_ms.append(at_ms)
    latencies_ms = latency_samples(rng, pct50, pct75, count)
    keys = [[f"fakeKey{rng.randrange(KEY_SPACE)}" for _ in range(KEYS_PER_REQUEST)] for _ in range(count)]
    clock = MonotonicClock()
    timer: SystemTimer | CallLaterTimer
    if timer_kind == "wheel":
        timer = SystemTimer("bench-purgatory", clock=clock)
        timer.start()
    else:
        timer = CallLaterTimer()
    purgatory: DelayedOperationPurgatory[FakeOperation] = DelayedOperationPurgatory(
        "fake purgatory", cast(SystemTimer, timer), purge_interval=1000)
    completed = [0]
    completions: list[tuple[float, int, FakeOperation]] = []
    peak_watched = peak_delayed = 0
    gc.collect()
    cpu_started = time.process_time()
    started = time.perf_counter()
    issued = 0
    while issued < count:
        now_ms = (time.perf_counter() - started) * 1000
        while completions and completions[0][0] <= now_ms:
            heapq.heappop(completions)[2].force_complete()
        while issued < count and arrivals_ms[issued] <= now_ms:
            op = FakeOperation(TIMEOUT_MS, completed)
            if latencies_ms[issued] < TIMEOUT_MS:
                heapq.heappush(completions, (now_ms + latencies_ms[issued], issued, op))
            purgatory.try_complete_else_watch(op, keys[issued])
            issued += 1
        peak_watched = max(peak_watched, purgatory.watched)
        peak_delayed = max(peak_delayed, purgatory.delayed)
        # Sleep until the next arrival, at least 1 ms (like Kafka's generator, whose clock is in ms), so the
        # process CPU time measures work rather than polling; arrivals due meanwhile are issued as a batch.
        wait_ms = arrivals_ms[issued] - now_ms if issued < count else 0
        await asyncio.sleep(max(wait_ms, 1) / 1000 if wait_ms > 0 else 0)
    enqueue_s = time.perf_counter() - started
    while completed[0] < count:
        now_ms = (time.perf_counter() - started) * 1000
        while completions and completions[0][0] <= now_ms:
            heapq.heappop(completions)[2].force_complete()
        await asyncio.sleep(0.001)
    elapsed_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    await purgatory.shutdown()
    return {
        "timer": timer_kind, "target_rate": round(count / (arrivals_ms[-1] / 1000)),
        "actual_rate": round(count / enqueue_s), "elapsed_s": round(elapsed_s, 3), "cpu_s": round(cpu_s, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_watched": peak_watched, "peak_delayed": peak_delayed, "requests": count,
        # CPU per request is robust to other processes taking the CPU; rates are not.
        "cpu_us_per_request": round(cpu_s / count * 1e6, 2),
    }


async def main(args: argparse.Namespace) -> dict:
    rates = [int(r) for r in args.rates.split(",")]
    results: dict[str, dict] = {}
    for case, (pct50, pct75) in CASES.items():
        results[case] = {}
        for timer_kind in ("wheel", "call_later"):
            runs = []
            for rate in rates:
                attempts = [await run_once(timer_kind, rate, int(rate * args.seconds), pct50, pct75, seed=rate)
                            for _ in range(args.repeats)]
                run = max(attempts, key=lambda r: r["actual_rate"])
                runs.append(run)
                print(f"{case:12s} {timer_kind:10s} target {run['target_rate']:>7,}/s  actual "
                      f"{run['actual_rate']:>7,}/s  elapsed {run['elapsed_s']:.2f}s  cpu {run['cpu_s']:.2f}s "
                      f"({run['cpu_us_per_request']} us/req)  "
                      f"rss {run['peak_rss_mb']} MB  watched<= {run['peak_watched']:,}  "
                      f"delayed<= {run['peak_delayed']:,}", flush=True)
                if run["actual_rate"] < 0.8 * run["target_rate"]:
                    break  # well past saturation: higher rates only take longer
            sustained = [r["target_rate"] for r in runs if r["actual_rate"] >= 0.95 * r["target_rate"]]
            results[case][timer_kind] = {"runs": runs, "saturation_rate": max(sustained, default=0)}
            print(f"{case:12s} {timer_kind:10s} sustained up to {max(sustained, default=0):,}/s", flush=True)
    heartbeat: dict[str, float] = {}
    for timer_kind in ("wheel", "call_later"):
        heartbeat[timer_kind] = round(max([await heartbeats(timer_kind, 100_000, 300_000) for _ in range(3)]))
    heartbeat["ratio"] = round(heartbeat["wheel"] / heartbeat["call_later"], 2)
    print(f"heartbeats through the purgatory, 100k members: {heartbeat}", flush=True)
    return {"bench": "purgatory", "loop": args.loop, "python": sys.version.split()[0],
            "heartbeat_per_s_100k_members": heartbeat, "timeout_ms": TIMEOUT_MS, "keys": KEYS_PER_REQUEST,
            "key_space": KEY_SPACE, "cases": results}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--rates", default="25000,50000,75000,100000,150000")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds of arrivals per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per rate; the best actual rate is kept")
    parser.add_argument("--quick", action="store_true", help="two rates, one second each")
    arguments = parser.parse_args()
    if arguments.quick:
        arguments.rates, arguments.seconds, arguments.repeats = "25000,50000", 1.0, 1
    return arguments


if __name__ == "__main__":
    arguments = parse_args()
    run_and_print(main(arguments), arguments.loop)
