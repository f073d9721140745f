"""A purgatory's sweep of completed operations at soak scale: in one go against a batch of keys per loop callback.

    python -m bench.purge_sweep [--members 300000] [--repeats 3]

One purgatory with a pending DelayedHeartbeat-like operation per member key (as the 300k-member soak holds) and one
completed operation per member left in its list (an operation watched under two keys, completed through the other).
The sweep Kafka's estimate asks for is timed two ways in the same process: `purge_completed()` (every key in one
call: what `_purge` did on the loop before) and the loop sweep (`_purge` on a running loop: PURGE_BATCH keys a
callback). Printed per repeat: the longest callback's CPU time (this thread's: the machine's load does not change
it), the sweep's total CPU and its callbacks; then the ratios loop ÷ one go. A final JSON line has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from coordinator.purgatory import DelayedOperation, DelayedOperationPurgatory
from coordinator.timer.testing import manual_timer


class _Operation(DelayedOperation):
    __slots__ = ()

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        pass


def _filled(members: int) -> DelayedOperationPurgatory[_Operation]:
    """Every member key holds a pending operation and a completed one; the estimate just below a sweep."""
    timer, _ = manual_timer()
    purgatory: DelayedOperationPurgatory[_Operation] = DelayedOperationPurgatory("Heartbeat", timer, 1000,
                                                                                 owns_timer=False)
    purgatory.purge_interval = 10 ** 12  # no sweep while filling
    for i in range(members):
        purgatory.try_complete_else_watch(_Operation(60_000), [i])
    for i in range(members + 2):  # two more than pending: the trigger's check finds completed > pending
        op = _Operation(60_000)
        purgatory.try_complete_else_watch(op, [i if i < members else ("extra", i), ("own", i)])
        op.force_complete()
    purgatory.purge_interval = 1000
    return purgatory


async def _loop_sweep(members: int) -> dict[str, float]:
    purgatory = _filled(members)
    longest, total, callbacks = 0.0, 0.0, 0
    started = time.thread_time()
    purgatory.try_complete_else_watch(_Operation(60_000), ["trigger"])  # the watch whose check asks for a sweep
    first = (time.thread_time() - started) * 1000
    longest, total = first, first
    while purgatory.watched > members + 1:  # the pending ones and the trigger
        if callbacks > members:
            raise RuntimeError("the sweep did not start or did not end")
        turn = time.thread_time()
        await asyncio.sleep(0)  # one turn: the sweep's callback, then this task's step (next to nothing)
        spent = (time.thread_time() - turn) * 1000
        longest, total, callbacks = max(longest, spent), total + spent, callbacks + 1
    return {"longest_ms": longest, "total_ms": total, "callbacks": callbacks}


def _one_go(members: int) -> dict[str, float]:
    purgatory = _filled(members)
    started = time.thread_time()
    purgatory.purge_completed()
    spent = (time.thread_time() - started) * 1000
    return {"longest_ms": spent, "total_ms": spent, "callbacks": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--members", type=int, default=300_000, help="member keys (default 300000)")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of the two ways (default 3)")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"one_go": [], "loop": []}
    for repeat in range(1, args.repeats + 1):
        results["one_go"].append(_one_go(args.members))
        results["loop"].append(asyncio.run(_loop_sweep(args.members)))
        for way in ("one_go", "loop"):
            r = results[way][-1]
            print(f"repeat {repeat} {way:6s}: longest callback {r['longest_ms']:7.2f} ms CPU, sweep {r['total_ms']:7.1f} ms "
                  f"CPU in {r['callbacks']:.0f} callbacks", flush=True)
    summary: dict[str, Any] = {"members": args.members}
    for way in ("one_go", "loop"):
        summary[way] = {key: statistics.median(r[key] for r in results[way])
                        for key in ("longest_ms", "total_ms", "callbacks")}
    summary["longest_ratio"] = summary["loop"]["longest_ms"] / summary["one_go"]["longest_ms"]
    summary["total_ratio"] = summary["loop"]["total_ms"] / summary["one_go"]["total_ms"]
    print(f"medians: longest callback {summary['loop']['longest_ms']:.2f} against {summary['one_go']['longest_ms']:.1f} ms "
          f"(loop ÷ one go {summary['longest_ratio']:.3f}), sweep CPU {summary['total_ratio']:.2f}×")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
