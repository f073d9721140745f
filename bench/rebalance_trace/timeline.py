"""One rebalance's timeline in the race, for ours and Kafka under the same load generator: the generator's own
stamps (bench.coordinator's RoundStamps, BENCH_REBALANCE_STAMPS), our server's (this directory's sitecustomize.py)
and `perf record -a` samples of every process on the machine (cpu-clock, one sample per PERIOD_NS of a CPU's time,
stamped on CLOCK_MONOTONIC as the generator's marks are), each sample given to a step by its time and to a process
(our server's loop thread or its other threads, the generator, the broker, anything else) in user space or the
kernel by its pid and address.

Steps, as the generator sees them (both servers):
  joins sent          first JoinGroup written → last written (the generator's loop of 1,000 writes)
  → last join answer  last JoinGroup written → last JoinGroup answer arrived
  joins decoded       → the answers decoded (kio), the SyncGroups about to be packed (none with the C client)
  syncs sent          → every SyncGroup written (the leader's first, unless --leader-sync-last)
  → last sync answer  → the last SyncGroup answer arrived
  syncs decoded       → the answers decoded (the round's clock stops here; none with the C client)
and inside our server (its stamps, when it ran with them): the last JoinGroup handled (the join completes), the
first and last JoinGroup answer written, the leader's SyncGroup handled, its write queued, committed and
acknowledged on the loop, the last SyncGroup handled, the first and last SyncGroup answer written."""

from __future__ import annotations

import bisect
import statistics
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field

PERIOD_NS = 250_000  # perf record -e cpu-clock -c PERIOD_NS: a sample per 0.25 ms of a CPU's time
KERNEL_FROM = 0xffff800000000000
GENERATOR_STEPS = (("joins sent", "joins_sending", "joins_sent"),
                   ("-> last join answer", "joins_sent", "join_answer_last"),
                   ("joins decoded", "join_answer_last", "syncs_sending"),
                   ("syncs sent", "syncs_sending", "syncs_sent"),
                   ("-> last sync answer", "syncs_sent", "sync_answer_last"),
                   ("syncs decoded", "sync_answer_last", "sync_answers_decoded"))
ROLES = ("server loop", "server threads", "generator", "broker", "other", "idle")


def perf_command(output: str) -> list[str]:
    return ["perf", "record", "-a", "-e", "cpu-clock", "-c", str(PERIOD_NS), "-k", "CLOCK_MONOTONIC", "-o", output]


@dataclass
class Round:
    server: str
    size: int
    number: int
    offset: float  # time.time() - time.monotonic() in the generator
    marks: dict[str, tuple[float, float]]  # event -> (monotonic, the generator's thread CPU)
    server_events: list[tuple[float, str, str]] = field(default_factory=list)  # (monotonic, event, detail)


def read_stamps(path: str) -> tuple[list[Round], dict[str, int]]:
    rounds, pids = [], {}
    for line in open(path):
        parts = line.split()
        if parts[0] == "process":
            pids[parts[1]] = int(parts[2])
        elif parts[0] == "round":
            marks = {}
            for item in parts[5:]:
                event, value = item.split("=")
                at, cpu = value.split(":")
                marks[event] = (float(at), float(cpu))
            rounds.append(Round(parts[1], int(parts[2]), int(parts[3]), float(parts[4]), marks))
    return rounds, pids


def attach_server_events(rounds: list[Round], trace_path: str) -> None:
    """Our server's stamps (wall clock) onto the rounds whose window holds them (converted to monotonic)."""
    events: list[tuple[float, str, str]] = []
    for line in open(trace_path):
        stamped, _thread, name, *rest = line.split(None, 3)
        events.append((float(stamped), name, rest[0].strip() if rest else ""))
    events.sort()
    times = [e[0] for e in events]
    for r in rounds:
        start = r.marks["joins_sending"][0] + r.offset
        end = r.marks["sync_answers_decoded"][0] + r.offset
        for at, event, detail in events[bisect.bisect_left(times, start):bisect.bisect_right(times, end)]:
            r.server_events.append((at - r.offset, event, detail))


@dataclass
class Samples:
    times: list[float]
    keys: list[tuple[str, bool]]  # (role, kernel)


def read_perf(path: str, pids: dict[str, int], ours: str) -> Samples:
    """`perf script` of the record: each sample's time, and whose it was."""
    text = subprocess.run(["perf", "script", "-i", path, "-F", "comm,pid,tid,time,ip"], capture_output=True,
                          text=True, check=True).stdout
    generator, server = pids.get("generator"), pids.get(ours)
    broker = next((pid for name, pid in pids.items() if name.startswith("kafka")), None)
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        pid_tid, at, ip = parts[-3], parts[-2].rstrip(":"), parts[-1]
        pid, _, tid = pid_tid.partition("/")
        p = int(pid)
        if p == 0:
            role = "idle"  # the CPU's idle task (swapper)
        elif p == server:
            role = "server loop" if int(tid) == p else "server threads"
        elif p == generator or parts[0].startswith("rbload"):  # --rebalance-client c: the C client's processes
            role = "generator"
        elif p == broker:
            role = "broker"
        else:
            role = "other"
        rows.append((float(at), (role, int(ip, 16) >= KERNEL_FROM)))
    rows.sort()
    return Samples([r[0] for r in rows], [r[1] for r in rows])


def cpu_in(samples: Samples, start: float, end: float) -> dict[tuple[str, bool], float]:
    """ms of CPU per (role, kernel) between two monotonic times."""
    out: dict[tuple[str, bool], float] = defaultdict(float)
    for key in samples.keys[bisect.bisect_left(samples.times, start):bisect.bisect_right(samples.times, end)]:
        out[key] += PERIOD_NS / 1e6
    return out


def _server_steps(r: Round) -> list[tuple[str, float, float]] | None:
    """Our server's steps of the round (name, start, end), monotonic; None without its stamps."""
    ev = r.server_events
    if not ev:
        return None

    def times(name: str, detail: str | None = None) -> list[float]:
        return [t for t, e, d in ev if e == name and (detail is None or d == detail)]

    joins_in, syncs_in = times("join_in"), times("sync_in")
    # every answer packed and queued for its connection's write (parked or answered at once)
    join_answers, sync_answers = times("answer_built", "11"), times("answer_built", "14")
    complete, leader = times("join_complete_start"), times("leader_sync")
    if not (joins_in and syncs_in and join_answers and sync_answers and complete and leader):
        return None
    queued = [t for t in times("queued") if t >= leader[0]]
    committed = [t for t in times("commit_returned") if t >= leader[0]]
    acked = [t for t in times("acked_on_loop") if t >= leader[0]]
    g = r.marks
    steps = [("first JoinGroup handled -> last handled (join completes)", joins_in[0], complete[0]),
             ("join completes -> first join answer written", complete[0], join_answers[0]),
             ("first join answer written -> last written", join_answers[0], join_answers[-1]),
             ("last join answer written -> arrived (generator)", join_answers[-1], g["join_answer_last"][0]),
             ("first SyncGroup handled -> leader's handled", syncs_in[0], leader[0])]
    if queued and committed and acked:
        steps += [("leader's SyncGroup handled -> write queued", leader[0], queued[0]),
                  ("write queued -> commit returned (producer thread)", queued[0], committed[0]),
                  ("commit returned -> acknowledged on the loop", committed[0], acked[0])]
    steps += [("first SyncGroup handled -> last handled", syncs_in[0], syncs_in[-1]),
              ("last SyncGroup handled -> last sync answer written", syncs_in[-1], sync_answers[-1]),
              ("first sync answer written -> last written", sync_answers[0], sync_answers[-1]),
              ("last sync answer written -> arrived (generator)", sync_answers[-1], g["sync_answer_last"][0])]
    if acked:
        steps.append(("acknowledged on the loop -> last sync answer written", acked[0], sync_answers[-1]))
    return steps


def _row(name: str, walls: list[float], cpus: list[dict[tuple[str, bool], float]]) -> str:
    n = len(cpus)
    cells = []
    for role in ROLES:
        user = sum(c.get((role, False), 0.0) for c in cpus) / n
        kernel = sum(c.get((role, True), 0.0) for c in cpus) / n
        cells.append(f"{user:5.1f}+{kernel:4.1f}")
    return f"| {name} | {statistics.median(walls):.2f} | " + " | ".join(cells) + " |"


def timeline(stamps_path: str, trace_path: str | None, perf_path: str | None, ours: str = "ours") -> str:
    rounds, pids = read_stamps(stamps_path)
    if trace_path:
        attach_server_events([r for r in rounds if r.server == ours], trace_path)
    samples = read_perf(perf_path, pids, ours) if perf_path else Samples([], [])
    header = ("| step | wall ms (median) | " + " | ".join(f"{role} user+kernel ms" for role in ROLES) + " |\n"
              "|---|---|" + "---|" * len(ROLES))
    out = []
    by_server: dict[tuple[str, int], list[Round]] = defaultdict(list)
    for r in rounds:
        by_server[(r.server, r.size)].append(r)
    for (server, size), measured in sorted(by_server.items(), key=lambda item: (item[0][1], item[0][0])):
        out.append(f"\n{server}, {size} members, {len(measured)} rounds (CPU: mean per round, perf samples)")
        out.append(header)
        for name, a, b in GENERATOR_STEPS:
            walls = [(r.marks[b][0] - r.marks[a][0]) * 1000 for r in measured]
            cpus = [cpu_in(samples, r.marks[a][0], r.marks[b][0]) for r in measured]
            out.append(_row(name, walls, cpus))
        whole = [(r.marks["joins_sending"][0], r.marks["sync_answers_decoded"][0]) for r in measured]
        out.append(_row("**the round**", [(b - a) * 1000 for a, b in whole],
                        [cpu_in(samples, a, b) for a, b in whole]))
        own = [(r.marks["sync_answers_decoded"][1] - r.marks["joins_sending"][1]) * 1000 for r in measured]
        out.append(f"generator thread CPU per round (thread_time): {statistics.median(own):.1f} ms")
        steps = [s for s in (_server_steps(r) for r in measured) if s is not None]
        if steps:
            out.append(f"\n{server}'s own stamps, {len(steps)} rounds")
            out.append(header)
            for i, (name, _, _) in enumerate(steps[0]):
                rows = [s[i] for s in steps if len(s) > i and s[i][0] == name]
                out.append(_row(name, [(b - a) * 1000 for _, a, b in rows],
                                [cpu_in(samples, a, b) for _, a, b in rows]))
    return "\n".join(out)
