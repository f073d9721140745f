"""python -m simulator: run seeds, report violations, replay one seed with its trace.

    python -m simulator --seeds 1000 --start 0     seeds 0..999; progress on stderr, a summary, a JSON line
    python -m simulator --seed 42 --trace          one seed, every event of its history (the replay of a failure)
    python -m simulator --plant NAME --seeds 100   with a planted bug: which seed finds it (--list-plants)
    python -m simulator --seeds 100000 --jobs 2    in worker processes; progress, seeds/min, CPU per seed
    python -m simulator --seed 42 --shrink         a failing seed minimised to a short replayable scenario
    python -m simulator --start 0 --seeds 200 --hashes h.txt   every seed's history hash, one "seed hash" line each
    COORDINATOR_COMPILED=DIR python -m simulator ...   the coordinator's modules from a compiled build (mypyc)
    python -m simulator.stitch chunk-*.json        the final JSON lines of chunked runs, added up (gaps named)

Exit status 1 if any seed violated an invariant. The process runs with PYTHONHASHSEED=0 (it re-executes itself
otherwise): the iteration order of sets of strings depends on it, and a seed must replay in any process.
"""
from __future__ import annotations

import argparse
import functools
import gc
import hashlib
import json
import multiprocessing
import os
import sys
import time
from typing import Iterator, TextIO

from coordinator import compiled

# COORDINATOR_COMPILED=DIR (or 1: build/compiled, scripts/build_compiled.py): the coordinator's listed modules run
# from that build, as `coordinator serve --compiled` runs them, each only while its sources match (installed here,
# before the simulator imports any of them; forked workers inherit it)
_COMPILED = compiled.directory_asked(os.environ.get(compiled.ENVIRONMENT))
_DECISION = None if _COMPILED is None else compiled.install(_COMPILED)

from simulator.plants import PLANTS  # noqa: E402
from simulator.run import PROTOCOLS, Outcome, make_scenario, run_seed  # noqa: E402
from simulator.shrink import Reduction, reduce_scenario, shrink  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run (default: %(default)s)")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default: %(default)s)")
    parser.add_argument("--seed", type=int, help="run this one seed only")
    parser.add_argument("--trace", action="store_true", help="print the seed's whole history (with --seed)")
    parser.add_argument("--stop-at-first", action="store_true", help="stop at the first failing seed")
    parser.add_argument("--plant", choices=sorted(PLANTS), help="run with this planted bug (stops at the first "
                                                                "seed that finds it)")
    parser.add_argument("--list-plants", action="store_true", help="list the planted bugs")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes for --seeds (default: "
                                                                "%(default)s; the seeds are reported in order)")
    parser.add_argument("--time-limit", type=float, metavar="SECONDS", help="stop after this much wall time "
                                                                           "(the summary covers the seeds run)")
    parser.add_argument("--shrink", action="store_true", help="with --seed: minimise the failing seed's scenario "
                                                              "and print a short replayable reproduction")
    parser.add_argument("--protocol", choices=PROTOCOLS,
                        help="what the groups speak: classic, consumer (KIP-848's ConsumerGroupHeartbeat) or mixed "
                             "(each group draws one) (default: classic, or what --plant needs)")
    parser.add_argument("--hashes", metavar="FILE", help="with --seeds: append each seed's history hash to FILE "
                                                         "(a \"seed hash\" line per seed, in seed order)")
    parser.add_argument("--reduce", metavar="SPEC", help="with --seed: run only part of the seed's scenario (what "
                                                         "--shrink prints)")
    args = parser.parse_args(argv)
    if args.protocol is None:
        args.protocol = PLANTS[args.plant].protocol if args.plant else "classic"
    if args.list_plants:
        for plant in PLANTS.values():
            print(f"{plant.name:<28} {plant.description} (caught by: {', '.join(sorted(plant.caught_by))})")
        return 0
    if args.seed is not None and args.shrink:
        return _shrink(args.seed, args.plant, args.protocol)
    if args.seed is not None:
        reduction = None if args.reduce is None else Reduction.decode(args.reduce)
        return _one(args.seed, args.trace, args.plant, reduction, args.protocol)
    return _many(args.start, args.seeds, args.stop_at_first or args.plant is not None, args.plant, args.jobs,
                 args.time_limit, protocol=args.protocol, hashes_path=args.hashes)


def _one(seed: int, trace: bool, plant: str | None, reduction: Reduction | None = None,
         protocol: str = "classic") -> int:
    outcome = run_seed(seed, keep_history=trace, plant=plant, reduction=reduction, protocol=protocol)
    if trace and outcome.history is not None:
        print(outcome.history.trace())
    _describe(outcome, sys.stdout, protocol)
    return 0 if outcome.ok else 1


def _shrink(seed: int, plant: str | None, protocol: str = "classic") -> int:
    """Minimises a failing seed (simulator/shrink.py) and prints the reduced scenario and its replay command."""
    original = run_seed(seed, plant=plant, protocol=protocol)
    if original.ok:
        print(f"seed {seed} holds every invariant: nothing to shrink")
        return 0
    invariant = original.violations[0].invariant
    scenario = make_scenario(seed, protocol)
    members = sum(len(g.members) for g in scenario.groups)
    print(f"seed {seed}: [{invariant}] {original.violations[0].message}", file=sys.stderr)
    print(f"  shrinking {len(scenario.faults)} faults, {members} consumers ...", file=sys.stderr)

    def violated(reduction: Reduction) -> set[str]:
        return {v.invariant for v in run_seed(seed, plant=plant, reduction=reduction, protocol=protocol).violations}

    started = time.perf_counter()
    reduction, runs = shrink(seed, violated, invariant, len(scenario.faults), members,
                             progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    reduced = run_seed(seed, plant=plant, reduction=reduction, protocol=protocol)
    kept = reduce_scenario(scenario, reduction)
    print(f"seed {seed} shrunk in {runs} runs ({time.perf_counter() - started:.1f}s): {kept.describe()}")
    for fault in kept.faults:
        print(f"  at {fault.at_ms / 1000:.3f}s {fault.kind} target={fault.target} for {fault.duration_ms} ms")
    for violation in reduced.violations[:3]:
        print(f"  {violation.line()}")
    plant_arg = ("" if plant is None else f" --plant {plant}") + _protocol_arg(protocol)
    print(f"  replay: python -m simulator --seed {seed}{plant_arg} --reduce \"{reduction.encode()}\" --trace")
    print(json.dumps({"seed": seed, "invariant": invariant, "runs": runs, "reduction": reduction.encode(),
                      "faults": len(kept.faults), "consumers": sum(len(g.members) for g in kept.groups),
                      "events": reduced.events, "original_events": original.events}))
    return 1


def _protocol_arg(protocol: str) -> str:
    return "" if protocol == "classic" else f" --protocol {protocol}"


def _outcomes(start: int, count: int, plant: str | None, jobs: int, protocol: str = "classic"
              ) -> Iterator[Outcome]:
    """Each seed's outcome, in seed order; with `jobs` > 1 run by that many worker processes (each a fork of
    this one, so PYTHONHASHSEED=0 holds there too)."""
    seeds = range(start, start + count)
    if jobs <= 1:
        for seed in seeds:
            yield run_seed(seed, plant=plant, protocol=protocol)
        return
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        yield from pool.imap(functools.partial(_run_quietly, plant=plant, protocol=protocol), seeds, chunksize=4)


def _run_quietly(seed: int, plant: str | None, protocol: str = "classic") -> Outcome:
    return run_seed(seed, plant=plant, protocol=protocol)


def _many(start: int, count: int, stop_at_first: bool, plant: str | None, jobs: int = 1,
          time_limit_s: float | None = None, *, protocol: str = "classic", hashes_path: str | None = None) -> int:
    # what the imports built lives as long as the process: out of the collector's way (fewer objects to walk in
    # every full collection); the workers forked later inherit it
    gc.collect()
    gc.freeze()
    started, cpu_started = time.perf_counter(), time.process_time()
    failing: list[Outcome] = []
    first_digest = ""
    # every seed's history hash, hashed in seed order: two runs of the same seeds compare with one value
    all_digests = hashlib.blake2b(digest_size=16)
    hashes = None if hashes_path is None else open(hashes_path, "a", encoding="utf-8")
    events = steps = run = 0
    virtual_ms = 0
    seeds_cpu_s = 0.0  # CPU of the runs themselves, in whichever process ran them
    last_report = started
    for outcome in _outcomes(start, count, plant, jobs, protocol):
        run += 1
        events += outcome.events
        steps += outcome.steps
        virtual_ms += outcome.virtual_ms
        seeds_cpu_s += outcome.cpu_s
        if outcome.seed == start:
            first_digest = outcome.digest
        all_digests.update(f"{outcome.seed} {outcome.digest}\n".encode())
        if hashes is not None:
            hashes.write(f"{outcome.seed} {outcome.digest}\n")
            hashes.flush()
        if not outcome.ok:
            failing.append(outcome)
            _describe(outcome, sys.stderr, protocol)
            if stop_at_first:
                break
        now = time.perf_counter()
        if time_limit_s is not None and now - started >= time_limit_s:
            print(f"time limit of {time_limit_s:.0f}s reached after {run} seeds", file=sys.stderr)
            break
        if now - last_report >= 5 or run == count:
            last_report = now
            elapsed = now - started
            eta = (count - run) * elapsed / run
            print(f"seeds {run}/{count}  failing {len(failing)}  {60 * run / elapsed:.0f} seeds/min  "
                  f"{1000 * seeds_cpu_s / run:.0f} ms CPU/seed  eta {eta:.0f}s", file=sys.stderr, flush=True)
    if hashes is not None:
        hashes.close()
    wall_s = time.perf_counter() - started
    cpu_s = max(seeds_cpu_s, time.process_time() - cpu_started)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
    print(f"ran {run} seeds ({start}..{start + run - 1}) with {jobs} job(s) in {wall_s:.1f}s wall, {cpu_s:.1f}s CPU "
          f"({60 * run / wall_s:.0f} seeds/min, {1000 * cpu_s / max(run, 1):.0f} ms CPU per seed, load average "
          f"{load:.1f}); {virtual_ms / 3_600_000:.1f} virtual hours, {events} events, {steps} loop callbacks; "
          f"{len(failing)} failing", file=sys.stderr)
    by_invariant: dict[str, int] = {}
    for outcome in failing:
        by_invariant[outcome.violations[0].invariant] = by_invariant.get(outcome.violations[0].invariant, 0) + 1
    if by_invariant:
        print("  by invariant: " + ", ".join(f"{name} {n}" for name, n in sorted(by_invariant.items())),
              file=sys.stderr)
    replay_plant = ("" if plant is None else f" --plant {plant}") + _protocol_arg(protocol)
    for outcome in failing:
        print(f"  seed {outcome.seed}: {outcome.violations[0].line()}", file=sys.stderr)
        print(f"    replay: python -m simulator --seed {outcome.seed}{replay_plant} --trace "
              f"(or --shrink)", file=sys.stderr)
    print(json.dumps({
        "seeds": run, "start": start, "jobs": jobs, "wall_s": round(wall_s, 2), "cpu_s": round(cpu_s, 2),
        "seeds_per_s": round(run / wall_s, 2), "seeds_per_min": round(60 * run / wall_s, 1),
        "cpu_ms_per_seed": round(1000 * cpu_s / max(run, 1), 1), "load_average": round(load, 2),
        "first_seed_history_hash": first_digest, "history_hashes_digest": all_digests.hexdigest(),
        "protocol": protocol, "events": events, "loop_callbacks": steps,
        "violations": [{"seed": o.seed, "invariant": o.violations[0].invariant,
                        "message": o.violations[0].message} for o in failing],
        "plant": None if plant is None else {"name": plant, "found": bool(failing), "seeds_run": run,
                                             "found_by_seed": failing[0].seed if failing else None},
    }))
    if plant is not None:  # a planted bug that is found is the expected outcome
        return 0 if failing else 1
    return 1 if failing else 0


def _describe(outcome: Outcome, out: TextIO, protocol: str = "classic") -> None:
    status = "ok" if outcome.ok else f"{len(outcome.violations)} violation(s)"
    print(f"seed {outcome.seed}: {status}; {outcome.scenario}; {outcome.events} events, history hash "
          f"{outcome.digest}, {outcome.wall_s:.2f}s", file=out)
    for violation in outcome.violations:
        print(f"  {violation.line()}", file=out)
    if not outcome.ok:
        print(f"  replay: python -m simulator --seed {outcome.seed}{_protocol_arg(protocol)} --trace", file=out)


def _say_compiled() -> None:
    """With a compiled build: how many of its modules this process ran compiled (their `__file__`), on stderr."""
    if _DECISION is None:
        return
    running = compiled.running_compiled([*_DECISION.compiled, *(n for n in _DECISION.fell_back if n != "*")])
    print(f"{_DECISION.summary().split(' compiled=[')[0]}; running compiled: {sum(running.values())} of "
          f"{len(running)} imported", file=sys.stderr)


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "simulator", *sys.argv[1:]])
    status = main()
    _say_compiled()
    sys.exit(status)
