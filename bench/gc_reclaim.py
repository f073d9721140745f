"""What the GC safety net costs: `GcPolicy.reclaim()` (unfreeze, one full collection, freeze again) over real
group state, against what the policy's own collections cost over the same state (everything frozen).

  python -m bench.gc_reclaim [--members 100000] [--group-size 10] [--repeats 3]

Forms `members` members in groups of `group-size` through GroupRuntime (in-memory store, real timer: every
member has its session operation and timer entry, every group its state), freezes what lives (as the policy
does), then times, `repeats` times each, interleaved: (a) a full collection with the state frozen (what the
policy leaves: the baseline) and (b) `reclaim()`. Prints pause and CPU time of each (median), CPU per tracked
object, and a final JSON line with the ratio of the reclaim's CPU time to the answer-latency target (100 ms
max). CPU time (`thread_time`) is the figure to
trust on a shared machine; wall time is the stall a heartbeat would see.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time

from coordinator.config import CoordinatorConfig
from coordinator.group.api import JoinGroupProtocol, JoinGroupRequest, SyncGroupRequest, SyncGroupRequestAssignment
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.runtime_health import GcPolicy
from coordinator.timer import SystemTimer

CONFIG = CoordinatorConfig(group_initial_rebalance_delay_ms=0)
TARGET_MAX_LATENCY_MS = 100.0  # issue 14: heartbeat answers max <= 100 ms at 300k members
SESSION_MS = 1_800_000  # no member may expire while the rest form (nothing heartbeats here)
METADATA = b"\x00\x01\x00\x00\x00\x01\x00\x05topic\xff\xff\xff\xff"


async def _form_group(runtime: GroupRuntime, group_id: str, size: int) -> None:
    def join(_: int) -> JoinGroupRequest:
        return JoinGroupRequest(group_id, SESSION_MS, SESSION_MS, "", None, "consumer",
                                [JoinGroupProtocol("range", METADATA)], version=3, client_id="bench")

    joined = await asyncio.gather(*(runtime.join_group(join(i)) for i in range(size)))
    leader = next(j for j in joined if j.leader == j.member_id)
    assignments = [SyncGroupRequestAssignment(j.member_id, b"") for j in joined]
    await asyncio.gather(*(runtime.sync_group(SyncGroupRequest(
        group_id, j.generation_id, j.member_id, assignments=assignments if j is leader else [], version=3))
        for j in joined))


async def _form(runtime: GroupRuntime, members: int, group_size: int) -> None:
    groups = members // group_size
    started = time.monotonic()
    for batch in range(0, groups, 200):
        wave = range(batch, min(groups, batch + 200))
        await asyncio.gather(*(_form_group(runtime, f"g{g}", group_size) for g in wave))
        if batch % 2_000 == 0:
            print(f"formed {batch * group_size:,} members ({time.monotonic() - started:.0f} s)", flush=True)


def _timed(action) -> tuple[float, float, int]:
    started, started_cpu = time.perf_counter(), time.thread_time()
    collected = action()
    return (time.perf_counter() - started) * 1000, (time.thread_time() - started_cpu) * 1000, collected


async def main(args: argparse.Namespace) -> dict:
    timer = SystemTimer("bench")
    timer.start()
    runtime = GroupRuntime(CONFIG, timer, InMemoryGroupStore())
    policy = GcPolicy(freeze_every=1)
    try:
        await _form(runtime, args.members, args.group_size)
        gc.collect()
        tracked = len(gc.get_objects())
        gc.freeze()
        baseline, reclaim = [], []
        for _ in range(args.repeats):
            baseline.append(_timed(gc.collect))
            reclaim.append(_timed(lambda: policy.reclaim().collected))
        members = sum(len(g.members) for g in runtime.groups.values())
    finally:
        await runtime.shutdown()
        await timer.close()
        gc.unfreeze()

    def median(runs: list[tuple[float, float, int]], i: int) -> float:
        return round(statistics.median(r[i] for r in runs), 1)

    result = {
        "members": members, "tracked_objects": tracked,
        "baseline_pause_ms": median(baseline, 0), "baseline_cpu_ms": median(baseline, 1),
        "reclaim_pause_ms": median(reclaim, 0), "reclaim_cpu_ms": median(reclaim, 1),
        "reclaim_collected": max(r[2] for r in reclaim),
        "reclaim_cpu_ns_per_object": round(median(reclaim, 1) * 1e6 / tracked),
    }
    # The baseline's figure is ~0 (nothing to walk), so the ratio that means something is against the answer-
    # latency target of issue 14 (max 100 ms): how many times over it one reclaim holds the loop.
    result["ratio_reclaim_cpu_to_target_max_latency"] = round(result["reclaim_cpu_ms"] / TARGET_MAX_LATENCY_MS, 1)
    print(f"{members:,} members, {tracked:,} tracked objects")
    print(f"full collection, state frozen (the policy): pause {result['baseline_pause_ms']} ms, "
          f"CPU {result['baseline_cpu_ms']} ms")
    print(f"reclaim (unfreeze + full collection + freeze): pause {result['reclaim_pause_ms']} ms, "
          f"CPU {result['reclaim_cpu_ms']} ms ({result['reclaim_cpu_ns_per_object']} ns/object), "
          f"collected {result['reclaim_collected']}")
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gc_reclaim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=100_000)
    parser.add_argument("--group-size", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse_args()))))
