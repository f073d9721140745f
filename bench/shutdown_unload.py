"""What stopping the group runtime costs the loop: `GroupRuntime.shutdown` over many loaded groups, in process.

    python -m bench.shutdown_unload [--members 100000] [--group-size 10] [--consumer-members 0] [--loops asyncio,uvloop]
                                    [--baseline-tree DIR]

Classic groups of `--group-size` members loaded from the in-memory store (as the scaling test loads them; a manual
clock, so no session runs out), and `--consumer-members` members of consumer-protocol groups (KIP-848) joined
through ConsumerGroupHeartbeat; then `shutdown()`. A ticker rescheduled every loop turn measures each turn's CPU
time (this thread's: the machine's load does not change it) while the shutdown runs. Printed per loop: the longest
turn, the turns the shutdown spanned, its whole CPU time and that time per member. With `--baseline-tree DIR` (a
source tree of ours, e.g. `git archive` of an older commit) this file runs again in a child process with DIR's
`coordinator` package, and the figures are printed side by side with the ratios this tree ÷ DIR's. A final JSON
line has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

from coordinator.config import CoordinatorConfig
from coordinator.group.modern.heartbeat import HeartbeatRequest
from coordinator.group.records import GroupRecord, MemberRecord
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.timer import ManualClock, SystemTimer
from coordinator.topics import StaticTopics, TopicImage

SESSION_MS = 45_000
TOPIC = TopicImage(uuid.UUID(int=0xF00), "orders", 64)
SUBSCRIPTION = b"\x00\x00\x00\x00\x00\x01\x00\x06orders\xff\xff\xff\xff"  # ConsumerProtocolSubscription v0


def _store(members: int, group_size: int, now_ms: int) -> InMemoryGroupStore:
    store = InMemoryGroupStore()
    for g in range(members // group_size):
        group_id = f"classic-{g}"
        records = [MemberRecord(f"{group_id}-member-{m}", None, "client", "/127.0.0.1", 60_000, SESSION_MS,
                                SUBSCRIPTION, b"assignment") for m in range(group_size)]
        store.groups[group_id] = GroupRecord("consumer", 1, "range", records[0].member_id, now_ms, records)
    return store


async def _join_consumer_members(runtime: GroupRuntime, members: int, group_size: int) -> None:
    runtime.consumer_groups.topics = StaticTopics([TOPIC])
    for g in range(max(members // group_size, 0)):
        for m in range(group_size):
            request = HeartbeatRequest(f"consumer-{g}", f"consumer-{g}-member-{m}", 0, rebalance_timeout_ms=30_000,
                                       subscribed_topic_names=(TOPIC.name,), owned=[], client_id="client",
                                       client_host="/127.0.0.1")
            await runtime.consumer_group_heartbeat(request)


async def _measure(members: int, group_size: int, consumer_members: int) -> dict[str, Any]:
    clock = ManualClock(1_700_000_000_000)
    timer = SystemTimer("shutdown-unload", clock=clock)
    runtime = GroupRuntime(CoordinatorConfig(), timer, _store(members, group_size, clock.now_ms()), clock)
    await runtime.load()
    await _join_consumer_members(runtime, consumer_members, group_size)
    groups = len(runtime.groups) + sum(len(shard.consumer_groups) for shard in runtime.shards)
    loop = asyncio.get_running_loop()
    turns: list[float] = []
    last = [time.thread_time()]

    def tick() -> None:
        now = time.thread_time()
        turns.append(now - last[0])
        last[0] = now
        ticker[0] = loop.call_soon(tick)

    gc.collect()
    gc.freeze()  # the loaded state is long-lived: the service's collector policy would have frozen it
    gc.disable()  # a collection is not the shutdown's
    ticker = [loop.call_soon(tick)]
    await asyncio.sleep(0)  # the ticker's first turn: every turn measured from here on holds the shutdown
    turns.clear()
    started = last[0] = time.thread_time()
    try:
        await runtime.shutdown()
        spent = time.thread_time() - started
        await asyncio.sleep(0)  # the turn the shutdown ended in, closed by the ticker
    finally:
        ticker[0].cancel()
        gc.enable()
        gc.unfreeze()
    await timer.close()
    left = len(runtime.groups) + sum(len(shard.consumer_groups) for shard in runtime.shards)
    assert left == 0, f"{left} groups left after the shutdown"
    total_members = members // group_size * group_size + consumer_members // group_size * group_size
    return {"groups": groups, "members": total_members, "longest_turn_ms": max(turns) * 1000, "turns": len(turns),
            "shutdown_cpu_ms": spent * 1000, "us_per_member": spent * 1e6 / max(total_members, 1),
            "us_per_group": spent * 1e6 / max(groups, 1)}


def _run(loop_name: str, members: int, group_size: int, consumer_members: int) -> dict[str, Any]:
    if loop_name == "uvloop":
        import uvloop
        return uvloop.run(_measure(members, group_size, consumer_members))
    return asyncio.run(_measure(members, group_size, consumer_members))


def _baseline(tree: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    # run from DIR (`-c`: DIR first on the path, not this file's directory, whose bench/coordinator.py would shadow
    # the package)
    runner = f"import runpy; runpy.run_path({os.path.abspath(__file__)!r}, run_name='__main__')"
    command = [sys.executable, "-c", runner, "--members", str(args.members), "--group-size",
               str(args.group_size), "--consumer-members", str(args.consumer_members), "--loops", args.loops,
               "--json-only"]
    out = subprocess.run(command, env=env, cwd=os.path.abspath(tree), check=True, capture_output=True, text=True)
    figures: dict[str, dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def _line(name: str, figures: dict[str, Any]) -> str:
    return (f"{name:<9} longest turn {figures['longest_turn_ms']:8.2f} ms  turns {figures['turns']:6d}  "
            f"shutdown {figures['shutdown_cpu_ms']:8.1f} ms CPU  {figures['us_per_member']:5.2f} µs/member  "
            f"{figures['us_per_group']:6.1f} µs/group")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=100_000, help="members of classic groups")
    parser.add_argument("--group-size", type=int, default=10)
    parser.add_argument("--consumer-members", type=int, default=0, help="members of consumer-protocol groups")
    parser.add_argument("--loops", default="asyncio,uvloop")
    parser.add_argument("--baseline-tree", help="a source tree of ours to measure as 'before' beside this one")
    parser.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    loops = [name for name in args.loops.split(",") if name]
    baseline = _baseline(args.baseline_tree, args) if args.baseline_tree else {}
    figures = {name: _run(name, args.members, args.group_size, args.consumer_members) for name in loops}
    if args.json_only:
        print(json.dumps(figures))
        return
    for name in loops:
        print(f"--- {name}: {figures[name]['groups']} groups, {figures[name]['members']} members")
        if name in baseline:
            print(_line("before", baseline[name]))
        print(_line("this tree", figures[name]))
        if name in baseline:
            before, after = baseline[name], figures[name]
            print(f"{'ratio':<9} longest turn {after['longest_turn_ms'] / before['longest_turn_ms']:8.3f}     "
                  f"shutdown CPU {after['shutdown_cpu_ms'] / before['shutdown_cpu_ms']:6.3f}")
    print(json.dumps({"this_tree": figures, "baseline": baseline}))


if __name__ == "__main__":
    main()
