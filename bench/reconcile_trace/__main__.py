"""Where a written ConsumerGroupHeartbeat's time goes inside our server: the reconcile race
(`bench.consumer_protocol --figures reconcile`) with timestamps taken in `coordinator serve`, then the median and
p90 of each step of every state write made during the measured rounds, per group size.

  python -m bench.reconcile_trace [--trace FILE] -- <bench.consumer_protocol args>
  python -m bench.reconcile_trace --analyse FILE

The stamps (this directory's sitecustomize.py, put on the server's PYTHONPATH; the bench marks each measured
round's start and end in the same file): the write made by the group logic, handed to the store (at once, or at
the end of the loop turn: `GroupRuntime.append_in_turn`), queued with the partition's producer, its transaction
begun (`_begin_commit`), the transaction's steps (librdkafka: begin/commit_transaction on the serial thread; native:
AddPartitionsToTxn, Produce, EndTxn), its outcome on the loop, the producer future's callbacks, the runtime's
settling, the parked heartbeat answered. Per transaction: writes, and CONCURRENT_TRANSACTIONS refusals (librdkafka's
`eos` debug lines; the native writer's own retry count). Either state writer (`--serve-arg='--state-writer
native'`); race one build of ours (a --baseline-tree's server is not stamped)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

_WRITE_STEPS = [
    ("made", "to_store", "made -> handed to the store (end of the turn)"),
    ("to_store", "begin", "handed -> its transaction begins (the one in flight)"),
    ("begin", "answered", "transaction begun -> outcome on the loop"),
    ("answered", "outcome_callback", "outcome -> the producer future's done callbacks"),
    ("answered", "settled", "outcome -> the runtime settles the write"),
    ("settled", "responded", "settled -> the heartbeat's answer written"),
    ("made", "responded", "made -> answer written (total)"),
]


def _load(path: str) -> list[tuple[float, str, list[str]]]:
    events = []
    for line in open(path):
        parts = line.split()
        if len(parts) >= 2:
            events.append((float(parts[0]), parts[1], parts[2:]))
    events.sort(key=lambda e: e[0])
    return events


def analyse(path: str) -> str:
    events = _load(path)
    windows: list[tuple[int, float, float]] = []
    start: dict[str, float] = {}
    for t, event, detail in events:
        if event == "round_start":
            start[detail[0]] = t
        elif event == "round_end" and detail[0] in start:
            windows.append((int(detail[0]), start.pop(detail[0]), t))
    out = []
    for size in sorted({w[0] for w in windows}):
        spans = [(a, b) for s, a, b in windows if s == size]
        inside = [e for e in events if any(a <= e[0] <= b for a, b in spans)]
        out.append(_size_report(size, len(spans), inside))
    return "\n".join(out)


def _size_report(size: int, rounds: int, events: list[tuple[float, str, list[str]]]) -> str:
    current: dict[str, dict[str, float]] = {}  # write id -> step -> time (the id's latest write)
    by_future: dict[str, list[dict[str, float]]] = {}  # producer future id -> its writes (latest)
    answer_of: dict[str, dict[str, float]] = {}
    done_writes: list[dict[str, float]] = []
    transactions: list[dict[str, Any]] = []
    open_txn: dict[str, dict[str, Any]] = {}  # producer name -> its transaction in flight
    refused = 0
    found: dict[str, Any] | None
    for t, event, detail in events:
        if event == "made":
            if detail[0] in current:
                done_writes.append(current[detail[0]])
            current[detail[0]] = {"made": t}
        elif event == "to_store" and detail[0] in current:
            current[detail[0]].setdefault("to_store", t)
        elif event == "link":
            records = [current[w] for w in detail[0].split(",") if w in current]
            for f in (detail[1].split(",") if len(detail) > 1 else []):
                if f:
                    by_future[f] = records
        elif event == "begin_commit":
            name, fids = detail[0], [f for f in (detail[1].split(",") if len(detail) > 1 else []) if f]
            records = [r for f in fids for r in by_future.get(f, ())]
            txn: dict[str, Any] = {"begin": t, "writes": len(records), "records": records, "name": name, "steps": {}}
            open_txn[name] = txn
            transactions.append(txn)
            for record in records:
                record.setdefault("begin", t)
        elif event in ("answered", "commit_end"):
            found = open_txn.get(detail[0])
            if found is not None and "answered" not in found:
                found["answered"] = t
                if event == "commit_end" and "retries_at_start" in found:
                    found["refused"] = int(detail[1]) - found["retries_at_start"]
                for record in found["records"]:
                    record.setdefault("answered", t)
        elif event == "commit_start":
            found = open_txn.get(detail[0])
            if found is not None:
                found["retries_at_start"] = int(detail[1])
        elif event.endswith("_start") or event.endswith("_end") or event in ("thread_begin", "commit_call",
                                                                              "commit_returned"):
            found = open_txn.get(detail[0].removesuffix("-calls"))
            if found is not None:
                found["steps"].setdefault(event, t)
        elif event == "dr":  # a record's delivery report served on the serial thread (the GIL taken for it)
            found = open_txn.get(detail[0].removesuffix("-calls"))
            if found is not None and "commit_returned" not in found["steps"]:
                found["steps"].setdefault("dr_first", t)
                found["dr_last"] = t
                found["drs"] = found.get("drs", 0) + 1
        elif event == "refused":
            refused += 1
            found = open_txn.get(detail[0].removesuffix("-calls")) if detail else None
            if found is not None and "answered" not in found:
                found["refusals"] = found.get("refusals", 0) + 1
        elif event == "outcome_callback":
            for record in by_future.get(detail[0], ()):
                record.setdefault("outcome_callback", t)
        elif event == "settled":
            for w in detail[0].split(","):
                if w in current:
                    current[w].setdefault("settled", t)
        elif event == "answer_future" and detail[0] in current:
            answer_of[detail[1]] = current[detail[0]]
        elif event == "responded" and detail[0] in answer_of:
            answer_of.pop(detail[0]).setdefault("responded", t)
    done_writes.extend(current.values())
    out = [f"{size} members: {rounds} rounds, {len(done_writes)} writes, {len(transactions)} transactions "
           f"(writes per transaction p50 {_q([x['writes'] for x in transactions], 0.5)}, "
           f"max {_q([x['writes'] for x in transactions], 1.0)}); ms p50 / p90 / max (count)"]
    for first, last, label in _WRITE_STEPS:
        values = [(w[last] - w[first]) * 1000 for w in done_writes if first in w and last in w]
        out.append(f"  {label:54s} {_q(values, 0.5):7.2f} {_q(values, 0.9):7.2f} {_q(values, 1.0):7.2f} "
                   f"({len(values)})")
    out.append("  per transaction (from its begin):")
    steps = sorted({s for x in transactions for s in x["steps"]}, key=lambda s: statistics.median(
        x["steps"][s] - x["begin"] for x in transactions if s in x["steps"]))
    for step in steps:
        values = [(x["steps"][step] - x["begin"]) * 1000 for x in transactions if step in x["steps"]]
        out.append(f"    {step:52s} {_q(values, 0.5):7.2f} {_q(values, 0.9):7.2f} {_q(values, 1.0):7.2f} "
                   f"({len(values)})")
    for label, first, last in (("begun on the loop -> the serial thread's begin_transaction", "begin", "thread_begin"),
                               ("commit_call -> first delivery report", "commit_call", "dr_first"),
                               ("first -> last delivery report", "dr_first", "dr_last"),
                               ("last delivery report -> commit returned", "dr_last", "commit_returned"),
                               ("commit returned -> outcome on the loop", "commit_returned", "answered")):
        spans = [(_at(x, first), _at(x, last)) for x in transactions]
        values = [(b - a) * 1000 for a, b in spans if a is not None and b is not None]
        out.append(f"    {label:52s} {_q(values, 0.5):7.2f} {_q(values, 0.9):7.2f} {_q(values, 1.0):7.2f} "
                   f"({len(values)})")
    drs = [x["drs"] for x in transactions if "drs" in x]
    out.append(f"    delivery reports per transaction p50 {_q(drs, 0.5)}, p90 {_q(drs, 0.9)}, max {_q(drs, 1.0)}")
    values = [(x["answered"] - x["begin"]) * 1000 for x in transactions if "answered" in x]
    out.append(f"    {'outcome on the loop':52s} {_q(values, 0.5):7.2f} {_q(values, 0.9):7.2f} "
               f"{_q(values, 1.0):7.2f} ({len(values)})")
    native = [x.get("refused", 0) for x in transactions if "retries_at_start" in x]
    total = sum(native) + refused
    out.append(f"  CONCURRENT_TRANSACTIONS refusals: {total} ({total / max(len(transactions), 1):.2f} per "
               f"transaction)")
    gaps = [(b["begin"] - a["answered"]) * 1000 for a, b in zip(transactions, transactions[1:])
            if "answered" in a and a["name"] == b["name"]]
    out.append(f"  outcome -> next transaction begins: p50 {_q(gaps, 0.5):.2f} ms, p90 {_q(gaps, 0.9):.2f}")
    # librdkafka's refusals (its `eos` lines, on the serial thread) by how soon after the last commit's outcome the
    # transaction began: Kafka refuses AddPartitionsToTxn while it writes the last commit's markers
    pairs = [((b["begin"] - a["answered"]) * 1000, b.get("refusals", 0)) for a, b in zip(transactions, transactions[1:])
             if "answered" in a and a["name"] == b["name"]]
    if refused:
        for low, high in ((0, 1), (1, 2), (2, 3), (3, 5), (5, 10), (10, 1e9)):
            inside = [count for gap, count in pairs if low <= gap < high]
            if inside:
                out.append(f"  begun {low}-{high if high < 1e9 else 'inf'} ms after the last outcome: {len(inside)} "
                           f"transactions, refused {sum(1 for c in inside if c)} ({sum(inside)} refusals)")
    return "\n".join(out)


def _at(transaction: dict[str, Any], step: str) -> float | None:
    """When the transaction reached `step` (its begin, answer, last delivery report or one of its stamped steps)."""
    if step in ("begin", "answered", "dr_last"):
        return transaction.get(step)
    return transaction["steps"].get(step)


def _q(values: Sequence[float], share: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return round(ordered[min(int(share * len(ordered)), len(ordered) - 1)], 2)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default="/tmp/reconcile_trace.log")
    parser.add_argument("--analyse", help="only analyse this trace file")
    parser.add_argument("bench_args", nargs="*", help="after --: bench.consumer_protocol's arguments")
    args = parser.parse_args(argv)
    if args.analyse:
        print(analyse(args.analyse))
        return 0
    if os.path.exists(args.trace):
        os.remove(args.trace)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])),
           "RECONCILE_TRACE": args.trace}
    bench = [sys.executable, "-m", "bench.consumer_protocol", "--figures", "reconcile", *args.bench_args]
    code = subprocess.run(bench, env=env, check=False).returncode
    print(analyse(args.trace))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
