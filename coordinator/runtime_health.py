"""How healthy the event loop is: how late it runs callbacks, and what the cyclic garbage collector costs it.

One event loop answers every heartbeat, so anything that holds the loop (a full collection walking every
group and member, a sweep over every watcher list, an accept storm) delays every answer behind it. Two probes:

- `LoopLagProbe` schedules a tick every `interval_ms` on the loop and records how late each tick ran. Lateness
  over `record_above_ms` is counted and bucketed; over `log_above_ms` it is logged with the collector time
  that fell inside the stall (so a log reader can tell a collection from anything else).
- `GcMonitor` times every collection through `gc.callbacks`: generation, pause, objects collected, and (for
  collections of the oldest generation) how many objects the collector had to walk.

`GcPolicy` keeps the full collections cheap. The collector walks every tracked object of the generations it
collects; a full collection walks all of them, so its pause grows with the number of groups and members (~0.8 µs
of CPU per object: 0.63 s at 100k members, bench/gc_reclaim.py). Objects that survived two young collections are
long-lived by any measure: the policy moves them into the permanent generation (`gc.freeze()`, O(1)) after
every generation-1 collection, so no collection walks them again. What is frozen is still freed by reference counting,
so this is safe for state without reference cycles (group, member and timer objects have none: see
tests/unit/test_runtime_health.py; nor do closed connections and relay links, on asyncio and uvloop:
tests/interop/test_relay_connection_cycles.py; nor does anything a direct connection, its requests and the
groups they form leave behind, whole service on Kafka included: tests/unit/test_server_connection_cycles.py,
tests/integration/test_service_cycles.py); a cycle that becomes garbage after it was frozen is only reclaimed by
`reclaim_frozen_cycles()`: a full stall, so only where asked (RuntimeHealth's `reclaim_interval_s`, off by
default: docs/operations.md says why).

`RuntimeHealth` bundles the three for the service (coordinator/app.py): its counters are read by telemetry
and by a periodic `event=runtime_health` log line.
"""
from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("coordinator.runtime")

LAG_BUCKETS_MS = (10, 25, 50, 100, 250, 500, 1_000, 5_000)  # upper bounds; one more bucket counts the rest
# GcPolicy's generation-0 threshold; 0 leaves the interpreter's 700. 5,000 saves ~5% of a 1,000-member rebalance's
# loop CPU but makes a young pause 3-5x longer: off until the 300k soak (p99, longest pause) has run with it.
YOUNG_THRESHOLD = 0


@dataclass
class LagCounters:
    ticks: int = 0
    late: int = 0  # ticks later than record_above_ms
    max_lag_ms: float = 0.0
    # CPU time this thread used between two ticks, at most: the stall we caused ourselves. On a loaded machine
    # lag can be far larger (the process was not scheduled); a lag with little CPU time is the machine's.
    max_busy_ms: float = 0.0
    total_late_ms: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LAG_BUCKETS_MS) + 1))


class LoopLagProbe:
    """Records how late the loop runs a tick scheduled every `interval_ms` (absolute deadlines, no drift)."""

    def __init__(self, interval_ms: float = 10.0, record_above_ms: float = 10.0, log_above_ms: float = 100.0,
                 gc_monitor: GcMonitor | None = None) -> None:
        self.interval_s = interval_ms / 1000
        self.record_above_ms = record_above_ms
        self.log_above_ms = log_above_ms
        self.gc_monitor = gc_monitor
        self.counters = LagCounters()
        self.window_max_lag_ms = 0.0  # since the last take_window_max()
        self.window_max_busy_ms = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = 0.0
        self._gc_pause_at_tick = 0.0
        self._cpu_at_tick = 0.0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._due = self._loop.time() + self.interval_s
        self._cpu_at_tick = time.thread_time()
        self._gc_pause_at_tick = self._gc_total()
        self._handle = self._loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def take_window_max(self) -> tuple[float, float]:
        """(lag, busy) maxima since the previous call."""
        values = self.window_max_lag_ms, self.window_max_busy_ms
        self.window_max_lag_ms = self.window_max_busy_ms = 0.0
        return values

    def _gc_total(self) -> float:
        return self.gc_monitor.total_pause_s if self.gc_monitor is not None else 0.0

    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        cpu = time.thread_time()
        lag_ms = (now - self._due) * 1000
        busy_ms = (cpu - self._cpu_at_tick) * 1000
        self.record(lag_ms, busy_ms)
        if lag_ms > self.log_above_ms:
            gc_ms = (self._gc_total() - self._gc_pause_at_tick) * 1000
            log.warning("event=loop_stall lag_ms=%.1f cpu_ms=%.1f gc_pause_ms=%.1f", lag_ms, busy_ms, gc_ms)
        self._gc_pause_at_tick = self._gc_total()
        self._cpu_at_tick = cpu
        # The next tick is due an interval after now, not after the missed deadline: a stall counts once.
        self._due = now + self.interval_s
        self._handle = loop.call_at(self._due, self._tick)

    def record(self, lag_ms: float, busy_ms: float = 0.0) -> None:
        c = self.counters
        c.ticks += 1
        if busy_ms > c.max_busy_ms:
            c.max_busy_ms = busy_ms
        if busy_ms > self.window_max_busy_ms:
            self.window_max_busy_ms = busy_ms
        if lag_ms > c.max_lag_ms:
            c.max_lag_ms = lag_ms
        if lag_ms > self.window_max_lag_ms:
            self.window_max_lag_ms = lag_ms
        if lag_ms <= self.record_above_ms:
            return
        c.late += 1
        c.total_late_ms += lag_ms
        for i, bound in enumerate(LAG_BUCKETS_MS):
            if lag_ms <= bound:
                c.buckets[i] += 1
                return
        c.buckets[-1] += 1


class CallbackTimer:
    """The longest loop callbacks in this thread's CPU time (which a loaded machine does not change), named.

    The busy stretch of `LoopLagProbe` is a whole loop iteration: a process the machine did not schedule for a
    while finds many connections readable and answers them all in one iteration, so that figure also grows with
    the answers queued. Timing each callback tells one callback whose cost grows with the members, groups or
    connections from many small ones. asyncio's own loops only (every callback runs through `Handle._run`;
    uvloop's handles are native, so `install` returns False there); off in the service unless asked
    (COORDINATOR_TIME_CALLBACKS=1): two clock reads per callback, ~1 µs."""

    def __init__(self, log_above_ms: float = 50.0) -> None:
        self.log_above_ms = log_above_ms
        self.longest_s = 0.0
        self.longest = ""
        self.window_longest_s = 0.0  # since the last take_window_max()
        self.window_longest = ""
        self._original: Callable[[asyncio.Handle], None] | None = None

    def install(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        loop = loop or asyncio.get_running_loop()
        if self._original is not None:
            return True
        if not isinstance(loop, asyncio.BaseEventLoop):
            return False
        original = self._original = asyncio.Handle._run

        def timed(handle: asyncio.Handle) -> None:
            started = time.thread_time()
            original(handle)
            spent = time.thread_time() - started
            if spent > self.window_longest_s:
                self._record(handle, spent)

        setattr(asyncio.Handle, "_run", timed)  # TimerHandle inherits it: every callback the loop runs
        return True

    def uninstall(self) -> None:
        if self._original is not None:
            setattr(asyncio.Handle, "_run", self._original)
            self._original = None

    def take_window_max(self) -> tuple[float, str]:
        """(longest callback s, what it was) since the previous call."""
        values = self.window_longest_s, self.window_longest
        self.window_longest_s, self.window_longest = 0.0, ""
        return values

    def _record(self, handle: asyncio.Handle, spent_s: float) -> None:
        what = callback_name(handle)
        self.window_longest_s, self.window_longest = spent_s, what
        if spent_s > self.longest_s:
            self.longest_s, self.longest = spent_s, what
        if spent_s * 1000 > self.log_above_ms:
            log.warning("event=slow_callback cpu_ms=%.1f callback=%s", spent_s * 1000, what)


def callback_name(handle: asyncio.Handle) -> str:
    """What a loop callback runs, without spaces (a task's step names its coroutine)."""
    callback = handle._callback  # type: ignore[attr-defined]
    while isinstance(callback, functools.partial):
        callback = callback.func
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        return f"task:{getattr(coro, '__qualname__', type(coro).__name__)}"
    return getattr(callback, "__qualname__", type(callback).__name__).replace(" ", "_")


@dataclass
class GenerationCounters:
    collections: int = 0
    total_pause_s: float = 0.0
    max_pause_s: float = 0.0
    max_cpu_pause_s: float = 0.0  # the same pause in this thread's CPU time: what the collection itself cost,
    collected: int = 0            # without the time a loaded machine gave to other processes meanwhile
    uncollectable: int = 0
    last_walked: int = 0  # objects in the collected generation (full collections only, see GcMonitor)


def generation_size(generation: int) -> int:
    """How many objects the collector's `generation` holds, counted in C from start to end.

    `len(gc.get_objects(generation))` holds a list of every one of them while the interpreter may hand the GIL to
    another thread (it checks for a switch after the call returns): an object of that generation then has one
    reference more than its owner knows of. A tuple being built by `tuple(iterable)` in that thread, promoted by
    the collection that ran this callback, fails its next resize ("SystemError: Objects/tupleobject.c:927: bad
    argument to internal function": a restarted `coordinator serve` could not start, telemetry importing on a
    thread while the relay decoded its first answers). Here the list is made, measured and freed inside C calls
    (`sum` pulling from two `map`s), with no bytecode in between, so no other thread runs while it exists."""
    return sum(map(len, map(gc.get_objects, (generation,))))


class _GcHook:
    """One callback in gc.callbacks (called before and after every collection), registered once while wanted."""

    _installed = False

    def _wanted(self) -> bool:
        return True

    def install(self) -> None:
        if self._wanted() and not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._callback)
            self._installed = False

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        raise NotImplementedError


class GcMonitor(_GcHook):
    """Times every collection via gc.callbacks (one callback before and one after each collection)."""

    def __init__(self, log_above_ms: float = 50.0) -> None:
        self.log_above_ms = log_above_ms
        self.generations = [GenerationCounters() for _ in range(3)]
        self.total_pause_s = 0.0
        self.window_max_pause_s = 0.0  # since the last take_window_max()
        self._started = 0.0
        self._started_cpu = 0.0

    def take_window_max(self) -> float:
        value, self.window_max_pause_s = self.window_max_pause_s, 0.0
        return value

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            self._started_cpu = time.thread_time()
            return
        pause_s = time.perf_counter() - self._started
        cpu_s = time.thread_time() - self._started_cpu
        generation = info["generation"]
        counters = self.generations[generation]
        counters.collections += 1
        counters.total_pause_s += pause_s
        counters.collected += info["collected"]
        counters.uncollectable += info["uncollectable"]
        if pause_s > counters.max_pause_s:
            counters.max_pause_s = pause_s
        if cpu_s > counters.max_cpu_pause_s:
            counters.max_cpu_pause_s = cpu_s
        if pause_s > self.window_max_pause_s:
            self.window_max_pause_s = pause_s
        self.total_pause_s += pause_s
        if generation == 2:
            # After a full collection every survivor sits in generation 2; counting them walks the list
            # once more (cheap next to the collection itself, and full collections are rare).
            counters.last_walked = generation_size(2)
        if pause_s * 1000 > self.log_above_ms:
            # no frozen count here: gc.get_freeze_count() walks every frozen object, a second stall
            log.warning("event=gc_pause generation=%d pause_ms=%.1f cpu_ms=%.1f collected=%d uncollectable=%d "
                        "survivors=%d", generation, pause_s * 1000, cpu_s * 1000, info["collected"],
                        info["uncollectable"], counters.last_walked if generation == 2 else -1)


class GcPolicy(_GcHook):
    """Freezes what survived a generation-1 collection, so no collection walks the long-lived state.

    `freeze_every`: freeze after every n-th generation-1 collection. 1 (the default): since `gc.freeze()` also
    resets the generation counts (CPython 3.11), no automatic full collection happens at all; young
    collections still free young cycles. n > 10: full collections run between freezes and walk only what was
    promoted since the last one, reclaiming cycles that die within ~n young collections. 0: the interpreter's
    default, which walks every long-lived object on each full collection (100k members: ~0.6 s of CPU).

    `young_threshold`: the interpreter's generation-0 threshold while installed (restored after; 0 leaves it).
    The default 700 starts a young collection every ~700 tracked objects a rebalance leaves alive (its parked
    requests, futures and answers): ~15–35 per 1,000-member rebalance, each with the monitor's and this policy's
    callbacks. What a collection walks is what is alive then, so fewer, larger young collections walk about as
    much in all: at 5,000, 1.6 young collections per 1,000-member rebalance instead of 15, 37.6–38.3 against
    39.7–39.9 ms of the loop's CPU (bench.rebalance_path, quiet); the price is a longer young pause: 1.1–1.7 ms
    of CPU instead of 0.35 ms in a rebalance, 5–11 ms instead of ~2 ms while 10,000 members form
    (docs/performance.md, 2026-11-28).
    """

    def __init__(self, freeze_every: int = 1, young_interval_s: float = 0.05,
                 young_threshold: int = YOUNG_THRESHOLD) -> None:
        self.freeze_every = freeze_every
        self.young_threshold = young_threshold
        self._threshold_before: tuple[int, ...] | None = None
        self.young_interval_s = young_interval_s  # 0: only the interpreter's own young collections
        self.young_collections = 0
        self._young: asyncio.TimerHandle | None = None
        self.freezes = 0
        self.frozen_total = 0  # objects this policy moved to the permanent generation (some died since)
        self.reclaims = 0
        self.reclaimed_objects = 0
        self._gen1_seen = 0

    def _wanted(self) -> bool:
        return self.freeze_every > 0

    def install(self) -> None:
        if self._wanted() and self.young_threshold > 0 and self._threshold_before is None:
            self._threshold_before = gc.get_threshold()
            gc.set_threshold(self.young_threshold, *self._threshold_before[1:])
        super().install()

    def uninstall(self) -> None:
        super().uninstall()
        if self._threshold_before is not None:
            gc.set_threshold(*self._threshold_before)
            self._threshold_before = None

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        # After a collection of generation 1 the young generations are empty and everything older than two
        # collections is in generation 2: move it to the permanent generation (a list splice, O(1)).
        if phase != "stop" or info["generation"] != 1:
            return
        self._gen1_seen += 1
        if self._gen1_seen % self.freeze_every == 0:
            # Counted here, not with gc.get_freeze_count(), which walks the whole permanent generation (~80 ns
            # an object: 77 ms of CPU at 100k members); generation 2 holds only what was promoted since the
            # last freeze.
            self.frozen_total += generation_size(2)
            gc.freeze()
            self.freezes += 1

    def start_young_collections(self) -> None:
        """Collects the young generations every `young_interval_s` on the loop. The interpreter starts a young
        collection when allocations outnumber deallocations by a threshold, so objects that replace dying ones (a
        session's timeout re-armed as a new operation once per session, while the old one is freed) never start
        one: the young list grows with the churn and the collection that finally comes walks all of it (50k
        members: 5–7 ms, growing with the members). On a timer the young list holds one interval's churn."""
        if self._wanted() and self.young_interval_s > 0 and self._young is None:
            self._young = asyncio.get_running_loop().call_later(self.young_interval_s, self._collect_young)

    def stop_young_collections(self) -> None:
        if self._young is not None:
            self._young.cancel()
            self._young = None

    def _collect_young(self) -> None:
        # generation 1 once it is due, as the interpreter would (this policy then freezes what survived)
        gc.collect(1 if gc.get_count()[1] >= gc.get_threshold()[1] else 0)
        self.young_collections += 1
        self._young = asyncio.get_running_loop().call_later(self.young_interval_s, self._collect_young)

    def reclaim(self, reason: str = "interval") -> Reclaimed:
        """The safety net, counted for metrics (see `reclaim_frozen_cycles`)."""
        reclaimed = reclaim_frozen_cycles(reason, refreeze=self.freeze_every > 0)
        self.reclaims += 1
        self.reclaimed_objects += reclaimed.collected
        return reclaimed


@dataclass(frozen=True)
class Reclaimed:
    collected: int  # objects only the cyclic collector could free: each one was a leak (see GcPolicy)
    pause_ms: float
    cpu_ms: float
    frozen_before: int
    frozen_after: int


def reclaim_frozen_cycles(reason: str, refreeze: bool = True) -> Reclaimed:
    """The safety net for a cycle that died after it was frozen: unfreeze, one full collection, freeze again,
    logged (WARNING when it found anything: a leak to report). A stall that walks every live object, ~0.8 µs of
    CPU each (bench/gc_reclaim.py: 0.63 s of CPU at 100k members, 1.85 s at 300k), holding the interpreter lock
    throughout (no other thread runs meanwhile); so the service runs it only where asked
    (COORDINATOR_GC_RECLAIM_INTERVAL_S)."""
    frozen_before = gc.get_freeze_count()
    started, started_cpu = time.perf_counter(), time.thread_time()
    gc.unfreeze()
    collected = gc.collect()
    if refreeze:
        gc.freeze()
    reclaimed = Reclaimed(collected, (time.perf_counter() - started) * 1000, (time.thread_time() - started_cpu) * 1000,
                          frozen_before, gc.get_freeze_count())
    log.log(logging.WARNING if collected else logging.INFO,
            "event=gc_reclaim reason=%s collected=%d pause_ms=%.1f cpu_ms=%.1f frozen_before=%d frozen_after=%d",
            reason, collected, reclaimed.pause_ms, reclaimed.cpu_ms, frozen_before, reclaimed.frozen_after)
    return reclaimed


class RuntimeHealth:
    """The probes and the policy of one service process; `snapshot()` is what metrics and logs read."""

    def __init__(self, *, lag_interval_ms: float = 10.0, lag_record_above_ms: float = 10.0,
                 lag_log_above_ms: float = 100.0, gc_log_above_ms: float = 50.0, freeze_every: int = 1,
                 summary_interval_s: float = 60.0, reclaim_interval_s: float = 0.0,
                 time_callbacks: bool = False, young_threshold: int = YOUNG_THRESHOLD) -> None:
        self.gc = GcMonitor(gc_log_above_ms)
        self.callbacks = CallbackTimer(lag_log_above_ms) if time_callbacks else None
        self._timing_callbacks = False
        self.lag = LoopLagProbe(lag_interval_ms, lag_record_above_ms, lag_log_above_ms, self.gc)
        self.policy = GcPolicy(freeze_every, young_threshold=young_threshold)
        self.summary_interval_s = summary_interval_s
        self.reclaim_interval_s = reclaim_interval_s  # 0: never (the default; docs/operations.md says why)
        self._summary: asyncio.Task[None] | None = None
        self._reclaimer: asyncio.Task[None] | None = None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> RuntimeHealth:
        """COORDINATOR_GC_FREEZE_EVERY (0 disables the policy), COORDINATOR_LOOP_STALL_LOG_MS,
        COORDINATOR_HEALTH_LOG_INTERVAL_S, COORDINATOR_GC_RECLAIM_INTERVAL_S (0, the default: never),
        COORDINATOR_TIME_CALLBACKS (1: time every loop callback, asyncio's loop only),
        COORDINATOR_GC_YOUNG_THRESHOLD (the generation-0 threshold while the policy runs; 0: the interpreter's)."""
        env = os.environ if environ is None else environ
        return cls(freeze_every=int(env.get("COORDINATOR_GC_FREEZE_EVERY", "1")),
                   lag_log_above_ms=float(env.get("COORDINATOR_LOOP_STALL_LOG_MS", "100")),
                   summary_interval_s=float(env.get("COORDINATOR_HEALTH_LOG_INTERVAL_S", "60")),
                   reclaim_interval_s=float(env.get("COORDINATOR_GC_RECLAIM_INTERVAL_S", "0")),
                   young_threshold=int(env.get("COORDINATOR_GC_YOUNG_THRESHOLD", str(YOUNG_THRESHOLD))),
                   time_callbacks=env.get("COORDINATOR_TIME_CALLBACKS", "0") == "1")

    def start(self) -> None:
        self.gc.install()
        self.policy.install()
        self.policy.start_young_collections()
        self.lag.start()
        loop = asyncio.get_running_loop()
        if self.callbacks is not None:
            self._timing_callbacks = self.callbacks.install(loop)
            if not self._timing_callbacks:
                log.warning("event=callback_timing_unavailable loop=%s", type(loop).__module__)
        if self.summary_interval_s > 0:
            self._summary = loop.create_task(self._log_summaries(), name="runtime-health")
        if self.reclaim_interval_s > 0:
            self._reclaimer = loop.create_task(self._reclaim_periodically(), name="gc-reclaim")

    async def stop(self) -> None:
        self.lag.stop()
        if self.callbacks is not None:
            self.callbacks.uninstall()
            self._timing_callbacks = False
        self.policy.stop_young_collections()
        self.policy.uninstall()
        self.gc.uninstall()
        for task in (self._summary, self._reclaimer):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._summary = self._reclaimer = None

    async def _reclaim_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.reclaim_interval_s)
            self.policy.reclaim()

    def snapshot(self) -> dict[str, float | int]:
        lag, gens = self.lag.counters, self.gc.generations
        return {
            "loop_ticks": lag.ticks, "loop_late": lag.late, "loop_lag_max_ms": round(lag.max_lag_ms, 1),
            "loop_busy_max_ms": round(lag.max_busy_ms, 1),
            **{f"gc{g}_collections": gens[g].collections for g in range(3)},
            **{f"gc{g}_pause_max_ms": round(gens[g].max_pause_s * 1000, 1) for g in range(3)},
            **{f"gc{g}_cpu_max_ms": round(gens[g].max_cpu_pause_s * 1000, 1) for g in range(3)},
            "gc_pause_total_ms": round(self.gc.total_pause_s * 1000, 1),
            # gc.get_freeze_count() would walk every frozen object (a stall growing with the members)
            "gc2_survivors": gens[2].last_walked, "gc_frozen_total": self.policy.frozen_total,
            "gc_freezes": self.policy.freezes, "gc_reclaims": self.policy.reclaims,
            "gc_reclaimed_objects": self.policy.reclaimed_objects,
            **({"callback_max_ms": round(self.callbacks.longest_s * 1000, 1)}
               if self.callbacks is not None and self._timing_callbacks else {}),
        }

    async def _log_summaries(self) -> None:
        while True:
            await asyncio.sleep(self.summary_interval_s)
            snap = self.snapshot()
            (window_lag, window_busy), window_gc = self.lag.take_window_max(), self.gc.take_window_max()
            callback = ""
            if self.callbacks is not None and self._timing_callbacks:
                callback_s, callback_what = self.callbacks.take_window_max()
                callback = f"window_callback_max_ms={callback_s * 1000:.1f} window_callback={callback_what or '-'} "
            log.info("event=runtime_health window_lag_max_ms=%.1f window_busy_max_ms=%.1f "
                     "window_gc_pause_max_ms=%.1f %s%s", window_lag, window_busy, window_gc * 1000, callback,
                     " ".join(f"{k}={v}" for k, v in snap.items()))
