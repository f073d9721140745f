"""Where a rebalance's wall time goes inside our server: the race (`bench.coordinator --figures rebalance`) with
timestamps taken in `coordinator serve`, then the median of each step per group size.

  python -m bench.rebalance_trace [--trace FILE] [--librdkafka-debug eos,protocol,msg] -- <bench.coordinator args>
  python -m bench.rebalance_trace --analyse FILE [--timeline STAMPS [--perf PERF]]
  python -m bench.rebalance_trace --timeline STAMPS --perf PERF -- <bench.coordinator args>   (ours and Kafka)

The stamps (this directory's sitecustomize.py, put on the server's PYTHONPATH): the join's completion, the leader's
SyncGroup, the write queued and handed to the producer's thread, begin/commit_transaction on that thread, the
write's callback on the loop, every parked JoinGroup/SyncGroup answered. Each row of the table is the median (and
range) over the rebalances of one size, in ms. Only the transactional write mode is stamped; race one build of ours
(no --baseline-tree: every `coordinator serve` started writes into the same trace). `--timeline`: a round's steps
as the load generator sees them, for ours and Kafka, with (`--perf`) each step's CPU by process (timeline.py)."""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Sequence

from bench.rebalance_trace.timeline import perf_command, timeline

HERE = os.path.dirname(os.path.abspath(__file__))
JOIN_GROUP, SYNC_GROUP = "11", "14"


def analyse(path: str) -> str:
    events = sorted((float(t), event, detail.strip()) for t, _, event, *rest in
                    (line.split(None, 3) for line in open(path)) for detail in [rest[0] if rest else ""])
    rebalances: list[tuple[int, list[tuple[float, str, str]]]] = []
    prepared: tuple[float, str, str] | None = None
    for t, event, detail in events:
        if event == "prepare":
            prepared = (t, event, detail)
        if event == "join_complete_start":
            rebalances.append((int(detail), [] if prepared is None else [prepared]))
            prepared = None
        if rebalances:
            rebalances[-1][1].append((t, event, detail))
    rows: dict[int, list[dict[str, float]]] = {}
    for size, steps in rebalances:
        row = _steps(steps)
        if row is not None:
            rows.setdefault(size, []).append(row)
    out = []
    for size, measured in sorted(rows.items()):
        out.append(f"{size} members: {len(measured)} rebalances, ms (median [min .. max])")
        for name in measured[0]:
            values = [r[name] for r in measured]
            out.append(f"  {name:38s} {statistics.median(values):8.2f}  [{min(values):.2f} .. {max(values):.2f}]")
    return "\n".join(out)


def _steps(steps: list[tuple[float, str, str]]) -> dict[str, float] | None:
    prepared = steps.pop(0)[0] if steps[0][1] == "prepare" else None
    start = steps[0][0]

    def first(name: str, after: float = 0.0) -> float | None:
        return next((t for t, event, _ in steps if event == name and t >= after), None)

    joins = [t for t, event, detail in steps if event == "answered" and detail == JOIN_GROUP]
    syncs = [t for t, event, detail in steps if event == "answered" and detail == SYNC_GROUP]
    leader = first("leader_sync")
    queued = first("queued", leader or 0)
    if leader is None or queued is None or not joins or not syncs:
        return None
    submit = first("submit", queued) or first("begin", queued)  # a build without _begin_commit: not split
    # a transaction opened ahead of the write (at the join's completion) has begun before it was queued
    opened = first("open_ahead_done")
    begin = first("begin", queued) or (submit if opened is not None and opened < queued else None)
    call, returned = first("commit_call", queued), first("commit_returned", queued)
    acked = first("acked_on_loop", queued)
    answered = first("writes_answered", queued) or acked  # a build without _answer: not split
    if None in (submit, begin, call, returned, acked, answered):
        return None
    assert submit and begin and call and returned and acked and answered
    ms = 1000
    row = {"first JoinGroup -> the join's completion": (start - prepared) * ms if prepared is not None else -1.0,
           "last JoinGroup answered": (max(joins) - start) * ms,
           "leader's SyncGroup arrives": (leader - start) * ms,
           "queued -> handed to the thread": (submit - queued) * ms,
           "handed -> begin_transaction": (begin - submit) * ms,
           "produce": (call - begin) * ms,
           "commit_transaction": (returned - call) * ms,
           "commit returned -> its writes answered": (answered - returned) * ms,
           "writes answered -> the group's callback": (acked - answered) * ms,
           "acknowledged -> last SyncGroup answer": (max(syncs) - acked) * ms,
           "leader's SyncGroup -> last answer": (max(syncs) - leader) * ms}
    if opened is not None and opened < queued:
        row["transaction opened ahead (from the join's completion)"] = (opened - start) * ms
    return row


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="/tmp/rebalance_trace.log")
    parser.add_argument("--librdkafka-debug", help="librdkafka debug contexts for the state producers")
    parser.add_argument("--analyse", help="only analyse this trace file")
    parser.add_argument("--timeline", metavar="STAMPS",
                        help="also the load generator's stamps of every round (ours and Kafka's) to STAMPS, and the "
                             "timeline of a round from them (timeline.py); with --perf, each step's CPU by process")
    parser.add_argument("--perf", metavar="FILE", help="perf record -a of the whole race to FILE (with --timeline)")
    parser.add_argument("bench_args", nargs="*", help="after --: bench.coordinator's arguments")
    args = parser.parse_args(argv)
    if args.analyse:
        print(analyse(args.analyse))
        if args.timeline:
            print(timeline(args.timeline, args.analyse, args.perf))
        return 0
    for path in (args.trace, args.timeline):
        if path and os.path.exists(path):
            os.remove(path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])),
           "REBALANCE_TRACE": args.trace}
    if args.timeline:
        env["BENCH_REBALANCE_STAMPS"] = args.timeline
    if args.librdkafka_debug:
        env["REBALANCE_TRACE_DEBUG"] = args.librdkafka_debug
    bench = [sys.executable, "-m", "bench.coordinator", "--figures", "rebalance", *args.bench_args]
    perf = subprocess.Popen(perf_command(args.perf), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) \
        if args.perf and args.timeline else None
    try:
        code = subprocess.run(bench, env=env, check=False).returncode
    finally:
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait(60)
    print(analyse(args.trace))
    if args.timeline:
        print(timeline(args.timeline, args.trace, args.perf if perf is not None else None))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
