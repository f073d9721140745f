"""CPU per heartbeat of the group logic and the session timer alone, in process, on virtual time: the soak's
pattern (groups of 10, a heartbeat every `--interval-s` per member, spread evenly, session `--session-ms`) without
sockets, so the figure is the CPU this process spends and the machine's load barely moves it.

  python -m bench.session_cpu [--members 20000,100000] [--seconds 60] [--warmup-s 40]

Loads the groups from the in-memory store (every member Stable), then advances a manual clock in 10 ms steps,
sending each member's heartbeat through `GroupRuntime.handle_heartbeat` at its turn and draining the timer after
every step (its expired buckets and cascades run as loop callbacks, as in the server). Prints, per size, the CPU
µs per heartbeat while measuring, how often a session operation ran (expired and re-armed itself or was
dropped) per heartbeat, and the members expired (0 expected: every member heartbeats in time).
"""
from __future__ import annotations

import argparse
import asyncio
import time

from bench import run_and_print
from coordinator.config import CoordinatorConfig
from coordinator.group.records import GroupRecord, MemberRecord
from coordinator.group.runtime import GroupRuntime
from coordinator.group.sessions import SessionTracking
from coordinator.group.store import InMemoryGroupStore
from coordinator.timer import ManualClock, SystemTimer
from protocol.error_codes import Errors
from tests.support.group_harness import subscription

GROUP_SIZE = 10
STEP_MS = 10


def _store(members: int, session_ms: int, now_ms: int) -> InMemoryGroupStore:
    store = InMemoryGroupStore()
    for g in range(members // GROUP_SIZE):
        ids = [f"m{g}-{i}" for i in range(GROUP_SIZE)]
        records = [MemberRecord(member_id, None, "client", "/127.0.0.1", 60_000, session_ms, subscription("t"),
                                b"") for member_id in ids]
        store.groups[f"g{g}"] = GroupRecord("consumer", 1, "range", ids[0], now_ms, records)
    return store


async def _drain() -> None:
    for _ in range(4):  # expired buckets, cascades and runs are loop callbacks
        await asyncio.sleep(0)


async def run_size(members: int, interval_ms: int, session_ms: int, warmup_ms: int, measure_ms: int) -> dict:
    clock = ManualClock(1_700_000_000_000)
    timer = SystemTimer("session-cpu", clock=clock)
    runtime = GroupRuntime(CoordinatorConfig(), timer, _store(members, session_ms, clock.now_ms()), clock)
    await runtime.load()
    expirations = 0
    runs = 0
    original = SessionTracking.on_expire_heartbeat

    def counted(self: SessionTracking, op: object) -> None:
        nonlocal runs
        runs += 1
        original(self, op)  # type: ignore[arg-type]

    SessionTracking.on_expire_heartbeat = counted  # type: ignore[method-assign]
    try:
        order = [(f"g{g}", f"m{g}-{i}") for i in range(GROUP_SIZE) for g in range(members // GROUP_SIZE)]
        per_step = len(order) * STEP_MS / interval_ms
        heartbeats = 0
        position = 0.0
        cpu_start = 0.0
        runs_start = 0
        elapsed_ms = 0
        while elapsed_ms < warmup_ms + measure_ms:
            if elapsed_ms == warmup_ms:
                cpu_start, runs_start, heartbeats = time.process_time(), runs, 0
            clock.advance(STEP_MS)
            elapsed_ms += STEP_MS
            timer.advance_clock()
            await _drain()
            end = position + per_step
            while position < end:
                group_id, member_id = order[int(position) % len(order)]
                group = runtime.groups.get(group_id)
                if group is not None and member_id in group.members:
                    error = runtime.handle_heartbeat(group_id, group.generation_id, member_id)
                    if error is not Errors.NONE:
                        expirations += 1
                heartbeats += elapsed_ms > warmup_ms
                position += 1
        cpu_s = time.process_time() - cpu_start
        missing = sum(GROUP_SIZE - len(runtime.groups[f"g{g}"].members) for g in range(members // GROUP_SIZE))
        return {"members": members, "heartbeats": heartbeats,
                "cpu_us_per_heartbeat": round(cpu_s * 1e6 / max(heartbeats, 1), 2),
                "session_runs_per_heartbeat": round((runs - runs_start) / max(heartbeats, 1), 3),
                "members_expired": missing, "heartbeat_errors": expirations}
    finally:
        SessionTracking.on_expire_heartbeat = original  # type: ignore[method-assign]
        await runtime.shutdown()
        await timer.close()


async def main(args: argparse.Namespace) -> dict:
    results = []
    for members in args.members:
        results.append(await run_size(members, int(args.interval_s * 1000), args.session_ms,
                                      int(args.warmup_s * 1000), int(args.seconds * 1000)))
    return {"results": results, "load_average": list(__import__("os").getloadavg())}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=lambda s: [int(x) for x in s.split(",")], default=[20_000, 100_000])
    parser.add_argument("--interval-s", type=float, default=10.0)
    parser.add_argument("--session-ms", type=int, default=30_000)
    parser.add_argument("--warmup-s", type=float, default=40.0, help="virtual seconds before measuring")
    parser.add_argument("--seconds", type=float, default=60.0, help="virtual seconds measured")
    return parser.parse_args()


if __name__ == "__main__":
    run_and_print(main(parse_args()), "asyncio")
