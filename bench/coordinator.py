"""The race against Apache Kafka's own group coordinator: the same load generator, the same group settings,
against (a) `coordinator serve` and (b) the embedded Apache Kafka broker's classic group coordinator.

  python -m bench.coordinator [--repeats 2] [--seconds 4] [--groups 1000] [--group-size 10]
                              [--connections 100,1000] [--rebalance-sizes 10,100,1000] [--expiry-pairs 500]
                              [--baseline-tree DIR] [--profile FILE]

Figures, each for both servers, with the ratio ours ÷ Kafka (throughput: higher is better; times and CPU per heartbeat: lower is better):
- heartbeat throughput and p50/p99 latency, `groups × group-size` members (default 10,000 in 1,000 groups) over
  100 and 1,000 connections, one heartbeat in flight per connection (closed loop), cycling through the members;
  plus the server's CPU time per heartbeat (from /proc), the robust figure on a shared machine;
- rebalance time of a Stable group of 10 / 100 / 1,000 members: every member sends JoinGroup with new metadata
  at once (the first to arrive starts the rebalance); clock from the first JoinGroup sent to the last SyncGroup
  answered; the leader assigns nothing (no client-side assignor time in the figure); one unmeasured rebalance
  per size first (`--rebalance-warmup`: the first server raced is otherwise measured cold); plus the server's CPU time
  per rebalance (all its threads, from /proc/<pid>/task/*/schedstat), the robust figure on a shared machine;
- failure-detection lateness: `expiry-pairs` two-member groups formed at once; after the join the leader (the
  victim) sends nothing, the follower's SyncGroup waits for the leader's assignment and is answered
  REBALANCE_IN_PROGRESS the moment the coordinator expires the victim (both coordinators schedule the session
  deadline at join completion). lateness = that answer − the victim's JoinGroup answer − session timeout. All
  pairs expire within about a second of each other.

Setup: one embedded Kafka broker serves as (b) and holds (a)'s state topic; group.initial.rebalance.delay.ms and
group.min.session.timeout.ms are set equal on both; our event topic is off (Kafka has none). The server under test
is pinned to CPU 0 (`taskset -a`, all threads: the broker JVM moves to CPU 1 while ours runs); the load generator
(this process) runs on CPU 1 and prints its own CPU use per figure (near 100%: it was the limit, not the server).
Repeats are interleaved (ours, Kafka, Kafka, ours, ...) and the median is reported.
Group formation uses a fresh group id for any group that did not form in one generation (busy machine).

Before/after in one run: `--baseline-tree DIR` races a second build of ours (a source tree, e.g. from
`git archive <commit> | tar -x -C DIR`, run with DIR as its working directory) as "before", interleaved with the
others, and adds the ratios after ÷ before. `--profile FILE` records our server with py-spy (`--format raw`,
200 Hz; `pip install -e '.[bench]'`; the baseline's to FILE.before, so both pay py-spy alike) during the rounds of
the largest rebalance size (environment: BENCH_PYSPY_RATE, BENCH_PYSPY_ARGS such as "--native", BENCH_PERF=1 for
`perf record -g` of the server beside py-spy, to FILE.perf (BENCH_PERF=dwarf: DWARF call graphs), and BENCH_STRACE=1
for `strace -c` of its main thread, the system calls counted, to FILE.strace (every thread's with
BENCH_STRACE=threads); BENCH_CPROFILE=1 for cProfile of our server's main thread instead,
bench.cprofiled's, to FILE.cprofile: every call counted; py-spy pauses the process per sample, so the CPU figures of a profiled
run are inflated: take them from a run without). `--leader-sync-last`: the leader's SyncGroup after the
followers', as a real leader's. `--broker-with-server`: the broker on our server's CPU while ours is measured.
`--rebalance-client c`: each rebalance's requests sent and read by bench/rbload.c over the same connections (this
process's Python costs 50-65 ms of CPU per 1,000-member rebalance, as much as a server, and set the pace).
BENCH_REBALANCE_STAMPS=FILE: each measured rebalance's steps as this process sees them (RoundStamps), for
`bench.rebalance_trace --timeline`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.cprofiled import OUTPUT_VARIABLE, PROFILE_OFF, PROFILE_ON
from bench.wire import LoadConnection, Stats, _process_cpu_s, heartbeat_frame
from coordinator.embedded import EmbeddedKafka, kafka_version
from coordinator.loadgen import wire
from protocol import apis, codec
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.consumer_protocol import Subscription, encode_subscription
from protocol.error_codes import Errors
from protocol.errors import ConnectionClosed, RequestTimedOut
from protocol.group_fastpath import pack_sync_group_request
from protocol.messages import build

METADATA = encode_subscription(Subscription(("bench",)))

INITIAL_DELAY_MS = 500
MIN_SESSION_MS = 1_000
FORM_SESSION_MS = 120_000
REBALANCE_MS = 60_000
# A forming group's rebalance timeout: a member whose JoinGroup comes after the group's join phase ended (a straggler
# on a busy machine) starts a rebalance the others never join; it is answered after this, and the group formed again
# under a new id, well before the client gives up (FORM_REBALANCE_MS + REQUEST_SLACK_MS)
FORM_REBALANCE_MS = 10_000
REQUEST_SLACK_MS = 20_000
MEMBER_ID_REQUIRED, REBALANCE_IN_PROGRESS = Errors.MEMBER_ID_REQUIRED, Errors.REBALANCE_IN_PROGRESS
SERVER_CPU, LOADGEN_CPU = 0, 1


# ---------------------------------------------------------------------------------------------- servers


@dataclass
class Server:
    name: str
    port: int
    pid: int


def pin(pid: int, cpu: int) -> None:
    """Every thread of `pid` onto `cpu` (taskset -a); a no-op where taskset is missing."""
    subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)


async def start_ours(bootstrap: str, name: str = "ours", source_tree: str | None = None, *,
                     config: Sequence[str] = (), module: str = "coordinator.cli",
                     environment: Mapping[str, str] | None = None, write_mode: str = "transactional",
                     stderr: Any = None, serve_args: Sequence[str] = ()) -> tuple[subprocess.Popen, Server]:
    """`coordinator serve` from this checkout, or from `source_tree` (its working directory and PYTHONPATH, so
    its packages shadow this checkout's); `config`: more `name=value` settings; `module`: what runs the command
    line (bench.cprofiled: the same under a switchable profiler), with `environment` added to ours; `write_mode`:
    serve's --write-mode (how the state topic is written; the default left out, for trees without the flag);
    `stderr`: where its log goes (default: this process's); `serve_args`: more arguments of serve (e.g.
    --state-writer native)."""
    env = None if source_tree is None and not environment else {**os.environ, **(environment or {})}
    if source_tree is not None:
        env["PYTHONPATH"] = source_tree  # type: ignore[index]
    process = subprocess.Popen(
        [sys.executable, "-m", module, "--log-level", "WARNING", "serve", "--listen", "127.0.0.1:0",
         "--bootstrap-server", bootstrap, "--state-topic", f"__bench_state_{uuid.uuid4().hex[:6]}",
         "--event-topic", "", *(("--write-mode", write_mode) if write_mode != "transactional" else ()),
         "--config", f"group.initial.rebalance.delay.ms={INITIAL_DELAY_MS}",
         "--config", f"group.min.session.timeout.ms={MIN_SESSION_MS}",
         *(argument for setting in config for argument in ("--config", setting)), *serve_args],
        stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=source_tree, env=env)
    line = await asyncio.to_thread(process.stdout.readline)  # type: ignore[union-attr]
    if "listening on" not in line:
        process.kill()
        raise RuntimeError(f"coordinator serve did not start: {line!r}")
    port = int(line.split()[3].rsplit(":", 1)[1])
    async with await KafkaClient.connect("127.0.0.1", port) as client:  # wait for the state load
        for _ in range(600):
            response = await client.request(build(apis.request_class(ApiKey.DESCRIBE_GROUPS, 5), groups=("probe",),
                                                  include_authorized_operations=False))
            if response.groups[0].error_code != 14:
                break
            await asyncio.sleep(0.1)
    extensions = compiled_extensions(process.pid)
    libraries = [e for e in extensions if "__mypyc" in os.path.basename(e)]
    print(f"{name}: {len(libraries)} mypyc librar{'y' if len(libraries) == 1 else 'ies'} of ours mapped, and "
          f"{len(extensions) - len(libraries)} module shims" + (f" (from {os.path.commonpath(extensions)})"
                                                                if extensions else ""), flush=True)
    return process, Server(name, port, process.pid)


def compiled_extensions(pid: int) -> list[str]:
    """The extension files a process has mapped outside the interpreter's own directories (the standard library,
    site-packages): ours, compiled by mypyc (`serve --compiled`, or a tree built by scripts/mypyc_tree.py): mypyc's
    library of the group, which holds every compiled module's code, and the shims of the modules the import system
    loaded (a compiled module's compiled imports are made by the library itself, without their shim). Read from
    /proc/PID/maps, so it says what the server loaded, whatever it was asked."""
    suffix = str(sysconfig.get_config_var("EXT_SUFFIX"))
    interpreter = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    try:
        with open(f"/proc/{pid}/maps") as maps:
            fields = [line.split(maxsplit=5) for line in maps]
    except OSError:
        return []
    paths = {parts[5].strip() for parts in fields if len(parts) == 6}
    return sorted(p for p in paths if p.endswith(suffix) and not os.path.realpath(p).startswith(interpreter))


# ---------------------------------------------------------------------------------------------- groups


# COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR
_COORDINATOR_NOT_READY = {14, 15, 16}


async def form_group(clients: list[KafkaClient], prefix: str, session_ms: int,
                     spares: Iterator[str] | None = None) -> tuple[str, list[Any]]:
    """A Stable group of len(clients) members, one per client, all in one generation; returns (group, joins).

    A group that does not come together in one generation (a straggler on a busy machine) is abandoned and
    formed again under a new id (`prefix-<attempt>`, or the next of `spares`), rather than rebalanced (that would
    be measuring rebalances, not heartbeats)."""
    errors: set[int] = set()
    for attempt in range(5):
        group_id = prefix if not attempt else next(spares) if spares is not None else f"{prefix}-{attempt}"
        await await_coordinator(clients[0], group_id)
        joined = await asyncio.gather(*(_join_with_id(c, group_id, session_ms) for c in clients))
        leader = next((j for j in joined if j.leader == j.member_id), None)
        if (all(j.error_code == 0 for j in joined) and len({j.generation_id for j in joined}) == 1
                and leader is not None and len(leader.members) == len(clients)):
            synced = await asyncio.gather(*(
                sync(c, group_id, j.generation_id, j.member_id, leader.members if j is leader else ())
                for c, j in zip(clients, joined)))
            if all(s.error_code == 0 for s in synced):
                return group_id, list(joined)
        await leave_all(clients[0], group_id, [j.member_id for j in joined if j.member_id])
        errors = {j.error_code for j in joined}
        if errors & _COORDINATOR_NOT_READY:  # a broker still loading its group state: back off as a client does
            await asyncio.sleep(0.5 * (attempt + 1))
    raise RuntimeError(f"group {prefix} did not form in 5 attempts (last JoinGroup errors: {sorted(errors)})")


def join(client: KafkaClient, group_id: str, member_id: str, session_ms: int, metadata: bytes = METADATA, *,
         rebalance_ms: int = REBALANCE_MS) -> Any:
    return wire.join_group(client, group_id, member_id, None, session_ms, rebalance_ms, "range", metadata, None)


async def await_coordinator(client: KafkaClient, group_id: str) -> None:
    """FindCoordinator until the server answers it for `group_id`, as a client does before joining: Kafka creates
    its offsets topic on the first FindCoordinator and answers JoinGroup NOT_COORDINATOR until then."""
    for _ in range(120):
        response = await client.request(wire.find_coordinator(client, group_id))
        if response.error_code == 0:
            return
        await asyncio.sleep(0.25)
    raise RuntimeError(f"no coordinator for {group_id} after 30 s (error {response.error_code})")


async def _join_with_id(client: KafkaClient, group_id: str, session_ms: int) -> Any:
    timeout_ms = FORM_REBALANCE_MS + REQUEST_SLACK_MS
    first = await client.request(join(client, group_id, "", session_ms, rebalance_ms=FORM_REBALANCE_MS),
                                 timeout_ms=timeout_ms)
    if first.error_code != MEMBER_ID_REQUIRED:
        return first
    return await client.request(join(client, group_id, first.member_id, session_ms, rebalance_ms=FORM_REBALANCE_MS),
                                timeout_ms=timeout_ms)


async def sync(client: KafkaClient, group_id: str, generation: int, member_id: str, members: Any = ()) -> Any:
    """The leader (members given) assigns every member one opaque byte: no client-side assignor time in the figures."""
    body = wire.sync_group(client, group_id, generation, member_id, None, "range",
                           {m.member_id: b"\x00" for m in members})
    return await client.request(body, timeout_ms=REBALANCE_MS)


async def leave_all(client: KafkaClient, group_id: str, member_ids: list[str]) -> None:
    version = client.version_for(ApiKey.LEAVE_GROUP, 5)
    cls = apis.request_class(ApiKey.LEAVE_GROUP, version)
    from protocol.messages import item_class

    entry = item_class(cls, "members")
    try:
        await client.request(build(cls, group_id=group_id, members=tuple(
            entry(member_id=m, group_instance_id=None, reason="bench done") for m in member_ids)))
    except (ConnectionClosed, RequestTimedOut):
        pass


async def connect_many(port: int, count: int, client_id: str = "bench") -> list[KafkaClient]:
    slots = asyncio.Semaphore(64)

    async def one() -> KafkaClient:
        async with slots:
            return await KafkaClient.connect("127.0.0.1", port, client_id=client_id, timeout_ms=REBALANCE_MS)

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def close_all(clients: list[KafkaClient]) -> None:
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


# ---------------------------------------------------------------------------------------------- figures


class LoadgenCpu:
    def __enter__(self) -> LoadgenCpu:
        self.wall, self.cpu = time.perf_counter(), _own_cpu_s()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu_used = _own_cpu_s() - self.cpu
        self.share = self.cpu_used / max(time.perf_counter() - self.wall, 1e-9)


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def heartbeat_figures(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    size, groups = args.group_size, args.groups
    pool = await connect_many(server.port, min(max(args.connections), groups * size))
    frames: list[bytes] = []
    formed: list[tuple[str, list[str]]] = []
    try:
        wave = max(1, len(pool) // size)
        for start in range(0, groups, wave):
            batch = range(start, min(start + wave, groups))
            results = await asyncio.gather(*(
                form_group(pool[(i - start) * size:(i - start + 1) * size], f"hb-{uuid.uuid4().hex[:6]}-{i}",
                           FORM_SESSION_MS) for i in batch))
            for group_id, joined in results:
                formed.append((group_id, [j.member_id for j in joined]))
                frames.extend(heartbeat_frame(group_id, j.generation_id, j.member_id) for j in joined)
        figures = {}
        for connections in args.connections:
            figures[str(connections)] = await drive_heartbeats(server, frames, connections, args.seconds)
        return figures
    finally:
        await asyncio.gather(*(leave_all(pool[i % len(pool)], g, ids) for i, (g, ids) in enumerate(formed)))
        await close_all(pool)


async def drive_heartbeats(server: Server, frames: list[bytes], connections: int, seconds: float, *,
                           stats: Stats | None = None) -> dict[str, Any]:
    """`stats`: what counts the answers and their errors (Heartbeat v4's by default)."""
    loop = asyncio.get_running_loop()
    stats = Stats() if stats is None else stats
    shares = [frames[i::connections] for i in range(connections)]
    protocols = []
    for share in shares:
        _transport, protocol = await loop.create_connection(functools.partial(LoadConnection, share, stats), "127.0.0.1",
                                                            server.port)
        protocols.append(protocol)
    for protocol in protocols:
        protocol.send_next()
    await asyncio.sleep(1.0)  # warm-up
    cpu_before = _process_cpu_s(server.pid)
    with LoadgenCpu() as own:
        started = time.perf_counter()
        stats.measuring = True
        await asyncio.sleep(seconds)
        stats.measuring = False
        elapsed = time.perf_counter() - started
    cpu_used = _process_cpu_s(server.pid) - cpu_before
    stats.running = False
    await asyncio.sleep(0.3)
    for protocol in protocols:
        protocol.transport.close()
    latencies = sorted(stats.latencies_ns)
    return {"heartbeats_per_s": round(stats.count / elapsed),
            "p50_ms": round(latencies[len(latencies) // 2] / 1e6, 3) if latencies else None,
            "p99_ms": round(latencies[int(len(latencies) * 0.99)] / 1e6, 3) if latencies else None,
            "server_cpu_us_per_heartbeat": round(cpu_used / max(stats.count, 1) * 1e6, 2),
            "server_cpu_share": round(cpu_used / elapsed, 2), "loadgen_cpu_share": round(own.share, 2),
            "error_responses": stats.errors}


async def rebalance_figures(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    figures = {}
    for size in args.rebalance_sizes:
        clients = await connect_many(server.port, size, args.client_id)
        group_id, joined = await form_group(clients, f"rb-{uuid.uuid4().hex[:6]}-{size}", FORM_SESSION_MS)
        member_ids = [j.member_id for j in joined]
        leader_id = next(j.member_id for j in joined if j.leader == j.member_id)
        times, sync_ms, cpu_ms, main_cpu_ms, system_shares, own_cpu_ms, own_shares = [], [], [], [], [], [], []
        thread_split = dict.fromkeys(_THREAD_SPLIT, 0)
        profiler = None
        in_c = args.rebalance_client == "c"
        try:
            for round_number in range(args.rebalance_warmup):  # unmeasured: a server's first rounds are cold
                if in_c:
                    await one_rebalance_c(clients, group_id, member_ids, leader_id,
                                          args.rebalance_rounds + round_number)
                else:
                    await one_rebalance(clients, group_id, member_ids, args.rebalance_rounds + round_number)
            profiler = start_profiler(server, args) if size == max(args.rebalance_sizes) else None
            stamps_path = os.environ.get("BENCH_REBALANCE_STAMPS")
            for round_number in range(args.rebalance_rounds):
                cpu_before, main_before = _server_cpu_ns(server.pid), _thread_cpu_ns(server.pid, server.pid)
                threads_before = _threads_cpu(server.pid)
                user_before, system_before = _user_system_ticks(server.pid)
                stamps = RoundStamps() if stamps_path else None
                with LoadgenCpu() as own:
                    if in_c:
                        total, sync_phase, c_cpu_ms = await one_rebalance_c(
                            clients, group_id, member_ids, leader_id, round_number,
                            leader_sync_last=args.leader_sync_last, stamps=stamps)
                    else:
                        total, sync_phase = await one_rebalance(clients, group_id, member_ids, round_number,
                                                                leader_sync_last=args.leader_sync_last, stamps=stamps)
                if stamps is not None and stamps_path:
                    stamps.write(stamps_path, server.name, size, round_number)
                times.append(total)
                sync_ms.append(sync_phase)
                cpu_ms.append((_server_cpu_ns(server.pid) - cpu_before) / 1e6)
                main_cpu_ms.append((_thread_cpu_ns(server.pid, server.pid) - main_before) / 1e6)
                user_after, system_after = _user_system_ticks(server.pid)
                _add_thread_split(thread_split, threads_before, _threads_cpu(server.pid), server.pid)
                system_shares.append((system_after - system_before,
                                      user_after - user_before + system_after - system_before))
                own_cpu_ms.append(c_cpu_ms if in_c else own.cpu_used * 1000)
                own_shares.append(c_cpu_ms / total if in_c else own.share)
        finally:
            stop_profiler(profiler)
            await leave_all(clients[0], group_id, member_ids)
            await close_all(clients)
        figures[str(size)] = {"rebalance_ms": round(statistics.median(times), 2),
                              "sync_phase_ms": round(statistics.median(sync_ms), 2),
                              "server_cpu_ms_per_rebalance": round(statistics.median(cpu_ms), 2),
                              # the process's first thread (for ours: the event loop's; for Kafka's JVM: main, idle)
                              "server_main_thread_cpu_ms_per_rebalance": round(statistics.median(main_cpu_ms), 2),
                              # the kernel's part of the server's CPU over every round (10 ms ticks, summed)
                              "server_system_cpu_share": _share(system_shares),
                              **_thread_split_figures(thread_split, args.rebalance_rounds),
                              "loadgen_cpu_ms_per_rebalance": round(statistics.median(own_cpu_ms), 2),
                              "rounds_ms": [round(t, 2) for t in times],
                              "loadgen_cpu_share": round(max(own_shares), 2)}
    return figures


def _server_cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` so far, in ns (the scheduler's own count: finer than /proc/<pid>/stat's
    10 ms ticks; a thread that ended between two readings takes its time with it)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _thread_cpu_ns(pid: int, tid: int) -> int:
    """CPU time of one thread of `pid` so far, in ns (schedstat); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            return int(f.read().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return 0


# the server's threads over a size's rounds: its first thread (ours: the event loop's) in user space and in the
# kernel (its schedstat time split by its stat ticks), librdkafka's threads ("rdk:*": the state write), the rest
_THREAD_SPLIT = ("loop_ns", "loop_user_ticks", "loop_system_ticks", "librdkafka_ns", "other_ns")


def _threads_cpu(pid: int) -> dict[int, tuple[str, int, int, int]]:
    """Every thread of `pid`: tid -> (its name, CPU ns so far (schedstat), user and system ticks (stat))."""
    threads = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                name, rest = f.read().split(" (", 1)[1].rsplit(") ", 1)
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = rest.split()
        threads[int(task)] = (name, ns, int(fields[11]), int(fields[12]))
    return threads


def _add_thread_split(split: dict[str, int], before: dict[int, tuple[str, int, int, int]],
                      after: dict[int, tuple[str, int, int, int]], pid: int) -> None:
    """One round's CPU of each thread (a thread born in the round counts from zero) added to `split`."""
    for tid, (name, ns, user, system) in after.items():
        _, ns0, user0, system0 = before.get(tid, (name, 0, 0, 0))
        if tid == pid:
            split["loop_ns"] += ns - ns0
            split["loop_user_ticks"] += user - user0
            split["loop_system_ticks"] += system - system0
        elif name.startswith("rdk:"):
            split["librdkafka_ns"] += ns - ns0
        else:
            split["other_ns"] += ns - ns0


def _thread_split_figures(split: dict[str, int], rounds: int) -> dict[str, float]:
    """Means per rebalance: the first thread's user and kernel CPU, librdkafka's threads', the other threads'."""
    ticks = split["loop_user_ticks"] + split["loop_system_ticks"]
    user_share = split["loop_user_ticks"] / ticks if ticks else 0.0  # (Kafka's first thread: idle)
    loop_ms = split["loop_ns"] / 1e6 / max(rounds, 1)
    return {"server_loop_user_cpu_ms_per_rebalance": round(loop_ms * user_share, 2),
            "server_loop_system_cpu_ms_per_rebalance": round(loop_ms * (1 - user_share), 2) if ticks else 0.0,
            "server_librdkafka_cpu_ms_per_rebalance": round(split["librdkafka_ns"] / 1e6 / max(rounds, 1), 2),
            "server_other_threads_cpu_ms_per_rebalance": round(split["other_ns"] / 1e6 / max(rounds, 1), 2)}


def _user_system_ticks(pid: int) -> tuple[int, int]:
    """(user, system) CPU of every thread of `pid` so far, in clock ticks (/proc/<pid>/stat's utime, stime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def _share(parts: list[tuple[int, int]]) -> float | None:
    """sum of the first ÷ sum of the second; None when nothing was counted."""
    whole = sum(total for _, total in parts)
    return round(sum(part for part, _ in parts) / whole, 3) if whole else None


async def run_interleaved(servers: list[Server], args: argparse.Namespace,
                          figures_of: Callable[[Server, argparse.Namespace], Awaitable[dict[str, Any]]],
                          results: dict[str, list[dict[str, Any]]], *, load_average: bool = False) -> None:
    """`args.repeats` repeats, interleaved (ours, (before,) kafka, then the reverse, ...): the server under test
    pinned to its CPU and every other one to the load generator's (the broker, the last server, too, unless
    `args.broker_with_server`: then, while "ours" is measured, it shares that server's CPU; the baseline's
    placement stays the default, so `--baseline-tree .` races the two placements); each repeat's figures appended
    and printed."""
    broker = servers[-1]
    for repeat in range(args.repeats):
        for server in servers if repeat % 2 == 0 else servers[::-1]:
            for other in servers:
                if other is not server:
                    pin(other.pid, LOADGEN_CPU)
            pin(server.pid, SERVER_CPU)
            if getattr(args, "broker_with_server", False) and server.name == "ours":
                pin(broker.pid, SERVER_CPU)
            started = time.perf_counter()
            figures = await figures_of(server, args)
            results[server.name].append(figures)
            load = f", load average {os.getloadavg()[0]:.1f}" if load_average else ""
            print(f"repeat {repeat + 1} {server.name}: {json.dumps(figures)} "
                  f"({time.perf_counter() - started:.0f} s{load})", file=sys.stderr, flush=True)


async def stop_servers(processes: list[subprocess.Popen], broker: Any) -> None:
    """The servers a race started (terminated, killed after 30 s) and the embedded broker with its data."""
    for process in processes:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
    await broker.stop()
    broker.remove_data()


def _cprofiled(args: argparse.Namespace) -> dict[str, Any]:
    """BENCH_CPROFILE=1 with --profile FILE: our server (not the baseline) under bench.cprofiled, its main thread's
    calls during the largest size's rounds to FILE.cprofile (pstats), instead of py-spy and perf."""
    if not (args.profile and os.environ.get("BENCH_CPROFILE")):
        return {}
    return {"module": "bench.cprofiled", "environment": {OUTPUT_VARIABLE: os.path.abspath(f"{args.profile}.cprofile")}}


def start_profiler(server: Server, args: argparse.Namespace) -> subprocess.Popen | None:
    if not args.profile or server.name.startswith("kafka"):  # ours and the baseline alike (py-spy costs CPU)
        return None
    if os.environ.get("BENCH_CPROFILE"):
        if server.name != "ours":
            return None
        os.kill(server.pid, PROFILE_ON)
        switched = subprocess.Popen(["sleep", "infinity"])  # what stop_profiler stops, with our server's profile
        _CPROFILED[switched.pid] = server.pid
        return switched
    output = args.profile if server.name == "ours" else f"{args.profile}.{server.name}"
    beside_python = os.path.join(os.path.dirname(sys.executable), "py-spy")
    executable = beside_python if os.path.exists(beside_python) else "py-spy"
    # BENCH_PYSPY_RATE (Hz, 200 by default) and BENCH_PYSPY_ARGS (more py-spy arguments, e.g. "--native");
    # BENCH_PERF=1: `perf record -g` of the same process beside it (to FILE.perf): the kernel's part (the
    # syscalls), the C extensions' and the interpreter's, and the other threads' (librdkafka's); BENCH_STRACE=1:
    # `strace -c` of the main thread (the event loop's system calls counted, to FILE.strace; BENCH_STRACE=threads:
    # of every thread, `strace -c -f`)
    extra = os.environ.get("BENCH_PYSPY_ARGS", "").split()
    profiler = subprocess.Popen([executable, "record", "--pid", str(server.pid),
                                 "--rate", os.environ.get("BENCH_PYSPY_RATE", "200"), "--format", "raw", *extra,
                                 "--output", output], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if os.environ.get("BENCH_STRACE"):
        threads = ["-f"] if os.environ["BENCH_STRACE"] == "threads" else []  # every thread's (librdkafka's too)
        _PERF.append(subprocess.Popen(["strace", "-c", *threads, "-p", str(server.pid), "-o", f"{output}.strace"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if os.environ.get("BENCH_PERF"):
        # BENCH_PERF=dwarf: DWARF call graphs (libpython and mypyc's extensions keep no frame pointers: -g's chains
        # stop at their first frame)
        graph = ["--call-graph", "dwarf,16384"] if os.environ["BENCH_PERF"] == "dwarf" else ["-g"]
        _PERF.append(subprocess.Popen(["perf", "record", *graph, "-F", "997", "-p", str(server.pid), "-o",
                                       f"{output}.perf"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # attached before the first round
    return profiler


_PERF: list[subprocess.Popen] = []  # perf beside py-spy (BENCH_PERF), stopped with it
_CPROFILED: dict[int, int] = {}  # BENCH_CPROFILE: the stand-in's pid -> our server's, switched off with it


def stop_profiler(profiler: subprocess.Popen | None) -> None:
    if profiler is None:
        return
    profiled = _CPROFILED.pop(profiler.pid, None)
    if profiled is not None:
        os.kill(profiled, PROFILE_OFF)  # the statistics written by the server (bench/cprofiled.py)
    while _PERF:
        perf = _PERF.pop()
        perf.send_signal(signal.SIGINT)
        try:
            perf.wait(30)
        except subprocess.TimeoutExpired:
            perf.kill()
    profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    try:
        profiler.wait(30)
    except subprocess.TimeoutExpired:
        profiler.kill()


class RoundStamps:
    """One measured rebalance's steps as the load generator sees them, for bench.rebalance_trace's timeline: each
    mark is (CLOCK_MONOTONIC, the clock `perf record -k mono` stamps its samples with; this thread's CPU time), and
    of each watched batch of answers the first and the last to arrive (their futures' done callbacks, which run a
    loop turn after the read that answered them). Appended per round to BENCH_REBALANCE_STAMPS as one line:
    `round <server> <size> <round> <time.time() - time.monotonic()> <event>=<monotonic>:<cpu> ...`."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float, float]] = []

    def mark(self, event: str) -> None:
        self.marks.append((event, time.monotonic(), time.thread_time()))

    def watch(self, answers: Sequence[asyncio.Future[Any]], event: str) -> None:
        seen: list[float] = []

        def arrived(_: asyncio.Future[Any]) -> None:
            now = time.monotonic()
            if not seen:
                self.marks.append((f"{event}_first", now, time.thread_time()))
            seen.append(now)
            if len(seen) == len(answers):
                self.marks.append((f"{event}_last", now, time.thread_time()))

        for answer in answers:
            answer.add_done_callback(arrived)

    def write(self, path: str, server: str, size: int, round_number: int) -> None:
        fields = " ".join(f"{event}={at:.6f}:{cpu:.6f}" for event, at, cpu in self.marks)
        with open(path, "a") as out:
            out.write(f"round {server} {size} {round_number} {time.time() - time.monotonic():.6f} {fields}\n")


def note_stamped_process(role: str, pid: int) -> None:
    """A process of the race, named in BENCH_REBALANCE_STAMPS (the timeline attributes perf's samples by pid)."""
    path = os.environ.get("BENCH_REBALANCE_STAMPS")
    if path:
        with open(path, "a") as out:
            out.write(f"process {role} {pid}\n")


async def one_rebalance(clients: list[KafkaClient], group_id: str, member_ids: list[str], round_number: int, *,
                        leader_sync_last: bool = False, stamps: RoundStamps | None = None) -> tuple[float, float]:
    """Every member rejoins with new metadata at once; ms from the first JoinGroup sent to the last SyncGroup
    answered, and of that the sync phase: from the first SyncGroup sent (after every JoinGroup answer) to the
    last answered, which holds the leader's assignment write. JoinGroup requests are encoded before the clock
    starts; SyncGroup requests need the generation, so they are packed by hand after the joins. `stamps`: the
    round's steps as this process sees them (BENCH_REBALANCE_STAMPS, for bench.rebalance_trace's timeline)."""
    # new metadata each round, as long as the formation's (a 10,000-member group's record must stay under 1 MB)
    metadata = encode_subscription(Subscription((f"b{round_number % 10_000:04d}",)))
    bodies = [join(c, group_id, m, FORM_SESSION_MS, metadata) for c, m in zip(clients, member_ids)]
    frames = []
    for client, body in zip(clients, bodies):
        correlation_id = client.next_correlation_id()
        frames.append((correlation_id, codec.encode_request(correlation_id, client.client_id, body)))
    started = time.perf_counter()
    if stamps is not None:
        stamps.mark("joins_sending")
    version = int(bodies[0].__version__)
    answers = [c.send_raw(frame, cid, ApiKey.JOIN_GROUP, version, timeout_ms=REBALANCE_MS)
               for c, (cid, frame) in zip(clients, frames)]
    if stamps is not None:
        stamps.mark("joins_sent")
        stamps.watch(answers, "join_answer")
    responses = await asyncio.gather(*answers)
    if stamps is not None:
        stamps.mark("join_answers_in")
    joined = [codec.decode_response(ApiKey.JOIN_GROUP, version, r)[1] for r in responses]
    if {j.error_code for j in joined} != {0} or len({j.generation_id for j in joined}) != 1:
        raise RuntimeError(f"rebalance round {round_number} of {group_id}: {[j.error_code for j in joined][:5]}")
    generation = joined[0].generation_id
    leader = next(j for j in joined if j.leader == j.member_id)
    # hand-packed (kio's writer would take milliseconds of the load generator over the leader's request)
    sync_version = clients[0].version_for(ApiKey.SYNC_GROUP, wire.HIGHEST[ApiKey.SYNC_GROUP])
    sends = []
    pairs = list(zip(clients, joined))
    if leader_sync_last:  # as a real leader, which runs its assignor before its SyncGroup
        pairs.sort(key=lambda pair: pair[1] is leader)
    sync_started = time.perf_counter()
    if stamps is not None:
        stamps.mark("syncs_sending")
    for client, j in pairs:
        correlation_id = client.next_correlation_id()
        assignments = [(m.member_id, b"\x00") for m in leader.members] if j is leader else []
        frame = pack_sync_group_request(sync_version, correlation_id, client.client_id, group_id, generation,
                                        j.member_id, None, "consumer", "range", assignments)
        sends.append(client.send_raw(frame, correlation_id, ApiKey.SYNC_GROUP, sync_version,
                                     timeout_ms=REBALANCE_MS))
        if stamps is not None and j is leader:
            stamps.mark("leader_sync_sent")
    if stamps is not None:
        stamps.mark("syncs_sent")
        stamps.watch(sends, "sync_answer")
    raw_synced = await asyncio.gather(*sends)
    if stamps is not None:
        stamps.mark("sync_answers_in")
    synced = [codec.decode_response(ApiKey.SYNC_GROUP, sync_version, r)[1] for r in raw_synced]
    ended = time.perf_counter()
    if stamps is not None:
        stamps.mark("sync_answers_decoded")
    if {s.error_code for s in synced} != {0}:
        raise RuntimeError(f"sync of {group_id} round {round_number}: {[s.error_code for s in synced][:5]}")
    return (ended - started) * 1000, (ended - sync_started) * 1000


async def one_rebalance_c(clients: list[KafkaClient], group_id: str, member_ids: list[str], leader_id: str,
                          round_number: int, *, leader_sync_last: bool = False,
                          stamps: RoundStamps | None = None) -> tuple[float, float, float]:
    """one_rebalance's round run by bench/rbload.c over the same connections (their reading paused meanwhile):
    the same requests (new metadata each round; the leader assigns every member one byte), timed by the C client:
    ms of the round, of its sync phase, and the C client's own CPU. Every frame is built before it starts; the
    generation, known from the JoinGroup answers only, is written into the SyncGroups by the C client. `stamps`:
    its steps' marks (its own clock and CPU), as one_rebalance's."""
    metadata = encode_subscription(Subscription((f"b{round_number % 10_000:04d}",)))
    bodies = [join(c, group_id, m, FORM_SESSION_MS, metadata) for c, m in zip(clients, member_ids)]
    version = int(bodies[0].__version__)
    sync_version = clients[0].version_for(ApiKey.SYNC_GROUP, wire.HIGHEST[ApiKey.SYNC_GROUP])
    if version < 6 or sync_version < 4:
        raise SystemExit("--rebalance-client c reads flexible answers: JoinGroup v6+ and SyncGroup v4+")
    order = sorted(range(len(clients)), key=lambda i: member_ids[i] == leader_id) if leader_sync_last \
        else list(range(len(clients)))
    assignments = [(m, b"\x00") for m in member_ids]

    def sync_frame(i: int, correlation_id: int, generation: int) -> bytes:
        return pack_sync_group_request(sync_version, correlation_id, clients[i].client_id, group_id, generation,
                                       member_ids[i], None, "consumer", "range",
                                       assignments if member_ids[i] == leader_id else [])
    probe = (sync_frame(0, 0, 0), sync_frame(0, 0, 0x7F7F7F7F))
    offset = next(k for k, (a, b) in enumerate(zip(*probe)) if a != b)
    lines = [f"{len(clients)} {offset}\n"]
    fds = []
    for i in order:
        client = clients[i]
        join_id = client.next_correlation_id()
        join_frame = codec.encode_request(join_id, client.client_id, bodies[i])
        transport: Any = getattr(client, "_transport")
        fds.append(transport.get_extra_info("socket").fileno())
        lines.append(f"{fds[-1]} {join_frame.hex()} {sync_frame(i, client.next_correlation_id(), 0).hex()}\n")
    plan = f"/tmp/rbload-{os.getpid()}.plan"
    with open(plan, "w") as out:
        out.writelines(lines)
    paused = [getattr(c, "_transport") for c in clients]
    for transport in paused:
        transport.pause_reading()
    try:
        done = await asyncio.to_thread(subprocess.run, [str(rbload_binary()), plan], pass_fds=fds,
                                       capture_output=True, text=True, check=False)
    finally:
        for transport in paused:
            transport.resume_reading()
        os.remove(plan)
    if done.returncode != 0:
        raise RuntimeError(f"rbload failed: {done.stderr.strip()}")
    result = json.loads(done.stdout)
    if result["join_errors"] or result["sync_errors"]:
        raise RuntimeError(f"rebalance round {round_number} of {group_id}: {result}")
    if stamps is not None:
        stamps.marks.extend((event, at, cpu) for event, (at, cpu) in result["marks"].items())
    return result["rebalance_ms"], result["sync_phase_ms"], result["cpu_ms"]


def rbload_binary() -> str:
    """bench/rbload.c, compiled once per source version."""
    return compiled_c_tool("rbload.c", "--rebalance-client c needs a C compiler (apt-get install gcc)")


def compiled_c_tool(source_name: str, no_compiler: str) -> str:
    """A load generator of bench/ written in C (`source_name`), compiled once per source version into the user's
    cache; its binary's path. `no_compiler`: the message to exit with when there is no C compiler."""
    source_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), source_name)
    with open(source_path, "rb") as source:
        digest = hashlib.sha256(source.read()).hexdigest()[:12]
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "coordinator-bench")
    binary = os.path.join(cache, f"{os.path.splitext(source_name)[0]}-{digest}")
    if not os.path.exists(binary):
        compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
        if compiler is None:
            raise SystemExit(no_compiler)
        os.makedirs(cache, exist_ok=True)
        partial = f"{binary}.tmp"
        subprocess.run([compiler, "-O2", "-o", partial, source_path], check=True)
        os.rename(partial, binary)
    return binary


async def detection_figures(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    pairs, session_ms = args.expiry_pairs, args.session_ms
    clients = await connect_many(server.port, 2 * pairs)
    try:
        with LoadgenCpu() as own:
            samples = await asyncio.gather(*(
                one_expiry(clients[2 * i], clients[2 * i + 1], f"ex-{uuid.uuid4().hex[:6]}-{i}", session_ms)
                for i in range(pairs)))
    finally:
        await close_all(clients)
    lateness = sorted(s for s in samples if s is not None)
    if not lateness:
        return {"pairs": pairs, "measured": 0}
    return {"pairs": pairs, "measured": len(lateness), "session_ms": session_ms,
            "lateness_p50_ms": round(lateness[len(lateness) // 2], 2),
            "lateness_p99_ms": round(lateness[min(len(lateness) - 1, int(len(lateness) * 0.99))], 2),
            "lateness_max_ms": round(lateness[-1], 2), "loadgen_cpu_share": round(own.share, 2)}


async def one_expiry(a: KafkaClient, b: KafkaClient, group_id: str, session_ms: int) -> float | None:
    joined = await asyncio.gather(_join_with_id(a, group_id, session_ms), _join_with_id(b, group_id, session_ms))
    if {j.error_code for j in joined} != {0} or len({j.generation_id for j in joined}) != 1:
        return None
    victim = next((j for j in joined if j.leader == j.member_id), None)
    if victim is None or len(victim.members) != 2:
        return None
    victim_client = b if victim is joined[1] else a
    watcher_client, watcher = (b, joined[1]) if victim is joined[0] else (a, joined[0])
    # the victim's last heartbeat: its deadline is the coordinator's receipt of it + session; we know its send
    # time, which is earlier, so the lateness below is an upper bound (never flattered by a late response)
    last_beat = wire.HeartbeatFrame(victim_client, group_id, victim.generation_id, victim.member_id, None)
    beat_sent = time.perf_counter()
    if last_beat.error_code(await last_beat.send(victim_client, REBALANCE_MS)) != 0:
        return None
    # the watcher parks its SyncGroup until the leader's assignment or the victim's expiry; one heartbeat (on the
    # victim's idle connection) halfway keeps the watcher itself alive
    parked = asyncio.ensure_future(sync(watcher_client, group_id, watcher.generation_id, watcher.member_id))
    await asyncio.sleep(session_ms / 2000)
    beat = wire.HeartbeatFrame(victim_client, group_id, watcher.generation_id, watcher.member_id, None)
    await beat.send(victim_client, REBALANCE_MS)
    response = await asyncio.wait_for(parked, session_ms / 1000 + 30)
    detected_at = time.perf_counter()
    if response.error_code != REBALANCE_IN_PROGRESS:
        return None
    return (detected_at - beat_sent) * 1000 - session_ms


# ---------------------------------------------------------------------------------------------- orchestration


async def run_server_figures(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    if "heartbeat" in args.figures:
        figures["heartbeat"] = await heartbeat_figures(server, args)
    if "rebalance" in args.figures:
        figures["rebalance"] = await rebalance_figures(server, args)
    if "detection" in args.figures:
        figures["detection"] = await detection_figures(server, args)
    return figures


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Field-wise median of numeric leaves across repeats (lists and strings from the first run)."""
    first = runs[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, dict):
            out[key] = median_of([r[key] for r in runs])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = round(statistics.median(r[key] for r in runs if r.get(key) is not None), 3)
        else:
            out[key] = value
    return out


def ratios(ours: dict[str, Any], kafka: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in ours.items():
        other = kafka.get(key)
        if isinstance(value, dict) and isinstance(other, dict):
            out[key] = ratios(value, other)
        elif isinstance(value, (int, float)) and isinstance(other, (int, float)) and other \
                and "share" not in key and "loadgen" not in key \
                and key not in ("pairs", "measured", "session_ms", "error_responses"):
            out[key] = round(value / other, 3)
    return out


def print_table(ours: dict[str, Any], kafka: dict[str, Any], ratio: dict[str, Any], prefix: str = "",
                labels: tuple[str, str] = ("ours", "kafka")) -> None:
    for key, value in ours.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            print_table(value, kafka.get(key, {}), ratio.get(key, {}), f"{name}.", labels)
        elif not isinstance(value, list):
            print(f"  {name:<52} {labels[0]} {value!s:>10}   {labels[1]} {kafka.get(key)!s:>10}   "
                  f"ratio {ratio.get(key, '')}")


def before_and_after(before: dict[str, Any], ours: dict[str, Any], kafka: dict[str, Any], tree: str
                     ) -> dict[str, Any]:
    """The baseline build's figures against Kafka's and ours against the baseline's, printed; the summary's keys."""
    before_ratio = ratios(before, kafka)
    print(f"\nbefore (the build in {tree}) / Kafka:")
    print_table(before, kafka, before_ratio, labels=("before", "kafka"))
    print("\nafter (ours) / before:")
    after_before = ratios(ours, before)
    print_table(ours, before, after_before, labels=("after", "before"))
    return {"before": before, "ratio_before_to_kafka": before_ratio, "ratio_after_to_before": after_before}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    os.sched_setaffinity(0, {LOADGEN_CPU})
    broker = EmbeddedKafka(extra_properties={
        "group.initial.rebalance.delay.ms": str(INITIAL_DELAY_MS),
        "group.min.session.timeout.ms": str(MIN_SESSION_MS)})
    await broker.start()
    processes: list[subprocess.Popen] = []
    servers: list[Server] = []
    try:
        process, ours = await start_ours(broker.bootstrap, write_mode=args.write_mode,
                                         serve_args=_split_args(args.serve_arg), **_cprofiled(args))
        processes.append(process)
        servers.append(ours)
        if args.baseline_tree:
            process, before = await start_ours(broker.bootstrap, "before", args.baseline_tree,
                                               write_mode=args.baseline_write_mode or args.write_mode,
                                               serve_args=_split_args(args.baseline_serve_arg))
            processes.append(process)
            servers.append(before)
        kafka = Server(f"kafka-{kafka_version()}", int(broker.bootstrap.rsplit(":", 1)[1]), broker.pid or 0)
        servers.append(kafka)
        note_stamped_process("generator", os.getpid())
        for server in servers:
            note_stamped_process(server.name, server.pid)
        results: dict[str, list[dict[str, Any]]] = {server.name: [] for server in servers}
        for server in servers[:-1]:
            pin(server.pid, LOADGEN_CPU)
        await run_interleaved(servers, args, run_server_figures, results)
    finally:
        await stop_servers(processes, broker)
    medians = {name: median_of(runs) for name, runs in results.items()}
    ours_median, kafka_median = medians["ours"], medians[kafka.name]
    ratio = ratios(ours_median, kafka_median)
    load = os.getloadavg()
    print(f"\nmedians of {args.repeats} interleaved repeats; ratio = ours / Kafka {kafka_version()} "
          f"(load average at the end {load[0]:.1f}, {os.cpu_count()} CPUs):")
    print_table(ours_median, kafka_median, ratio)
    summary: dict[str, Any] = {
        "bench": "coordinator", "kafka_version": kafka_version(), "repeats": args.repeats,
        "load_average_1m": round(load[0], 1), "ours": ours_median, "kafka": kafka_median, "ratio": ratio}
    if "before" in medians:
        summary.update(before_and_after(medians["before"], ours_median, kafka_median, args.baseline_tree))
    summary["runs"] = results
    return summary


def add_serve_arg_options(parser: argparse.ArgumentParser) -> None:
    """--serve-arg / --baseline-serve-arg (this bench's and bench.consumer_protocol's): split with `_split_args`."""
    parser.add_argument("--serve-arg", action="append", metavar="ARGS",
                        help="more arguments of our server's serve, e.g. --serve-arg='--state-writer native' "
                             "(repeatable; each value split on whitespace)")
    parser.add_argument("--baseline-serve-arg", action="append", metavar="ARGS",
                        help="more arguments of the baseline's serve (repeatable); with --baseline-tree . and "
                             "--serve-arg this races one build's two settings, e.g. the state writers")


def _split_args(values: Sequence[str] | None) -> list[str]:
    """--serve-arg values, each one or more whitespace-separated serve arguments."""
    return [part for value in values or () for part in value.split()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per heartbeat figure")
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--group-size", type=int, default=10)
    parser.add_argument("--connections", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1000])
    parser.add_argument("--rebalance-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[10, 100, 1000])
    parser.add_argument("--rebalance-rounds", type=int, default=3)
    parser.add_argument("--rebalance-warmup", type=int, default=1,
                        help="unmeasured rebalances per size first (the first server raced after the broker "
                             "starts is otherwise measured cold)")
    parser.add_argument("--expiry-pairs", type=int, default=500)
    parser.add_argument("--session-ms", type=int, default=2_000, help="session timeout of the expiry pairs")
    parser.add_argument("--figures", default="heartbeat,rebalance,detection")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    parser.add_argument("--client-id", default="bench",
                        help="of the rebalancing members; '' keeps a 10,000-member group's record (~99 bytes a member, "
                             "member ids are client id + uuid) under both servers' 1 MB write limit")
    parser.add_argument("--baseline-tree", help="a source tree of ours to race as 'before' (see above)")
    parser.add_argument("--write-mode", choices=["transactional", "idempotent"], default="transactional",
                        help="our server's state writes (serve --write-mode)")
    parser.add_argument("--baseline-write-mode", choices=["transactional", "idempotent"],
                        help="the baseline's state writes (default: --write-mode); with --baseline-tree . this races "
                             "one build's two write modes")
    add_serve_arg_options(parser)
    parser.add_argument("--profile", help="py-spy raw output file for our server (the baseline's: FILE.before) "
                        "during the largest rebalance")
    parser.add_argument("--broker-with-server", action="store_true",
                        help="while ours is measured, the broker holding its state on the server's CPU (its state "
                             "write's CPU counted on the server's side, as Kafka's own log append is), not on the load "
                             "generator's (the default, and always the baseline's: with --baseline-tree . this races "
                             "the two placements)")
    parser.add_argument("--rebalance-client", choices=["python", "c"], default="python",
                        help="what sends a rebalance's requests: this process (default), or bench/rbload.c over the "
                             "same connections (its CPU per rebalance a fraction of this process's)")
    parser.add_argument("--leader-sync-last", action="store_true",
                        help="the leader's SyncGroup sent after every follower's (a real leader runs its assignor "
                             "first); by default in member order")
    return parser.parse_args(argv)


if __name__ == "__main__":
    from bench import run_and_print

    arguments = parse_args()
    run_and_print(main(arguments), arguments.loop)
