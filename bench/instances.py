"""Heartbeat throughput of N coordinator instances against one Apache Kafka broker, all on the same cores.

  python -m bench.instances [--instances 1,2] [--connections 100,1000] [--groups 1000] [--group-size 10]
                            [--seconds 5] [--warmup 2] [--repeats 2] [--client c|python]

Servers under test, each measured with the same load:
- `ours×N`: N `coordinator serve --instance-id i<k> --no-relay` processes sharing one state topic (multi-instance
  mode: the instances divide the state topic's partitions between them through Kafka). Where this build has no
  `--instance-id` (or with `--independent`), N plain single instances with a state topic each stand in for it;
  the summary says which (`mode`).
- `kafka`: the embedded Apache Kafka broker's own classic group coordinator (the broker also holds our state
  topics, as in bench/coordinator.py).
Nothing is pinned: every server, the broker and the load generator share all the machine's cores (`os.cpu_count()`;
2 here), which is the point: N instances may use N cores, the broker's JVM uses as many as it likes.

The load is the same for every server: `groups × group-size` members (default 10,000 in 1,000 groups) of Stable
groups, formed through the coordinator that FindCoordinator names for each group (asked of the instances in
turn, so with several instances each group lands on its owner), then Heartbeat v4 requests, one in flight per
connection (closed loop), over 100 and 1,000 connections; each connection goes to one server and cycles through
members of that server's groups, connections divided in proportion to the members each server holds. The load
generator is `bench/hbload.c` (epoll, compiled on first use with the machine's C compiler; `--client python` is
the asyncio one from bench/wire.py, which costs as much CPU per heartbeat as the servers) and runs **on the same
machine**, competing for the same cores. It reads the CPU time (/proc, all threads) of every process over
exactly its measured window.

Figures per server and connection count (medians of the interleaved repeats): heartbeats/s, p50/p99, the CPU
time per heartbeat of the server under test (sum over its processes) and of the client, the cores each used,
and what the other bench processes used meanwhile (the broker, when it is only our store; our idle
instances, when Kafka is measured), and the rest of the machine (other users: /proc/stat less all of the above).
`cpu_bound_capacity_per_s` is what those CPU costs allow when the cores are the bench's alone: the cores (less what
the bench's other processes used) ÷ (server + client CPU per heartbeat), and for our instances also at most one
core each (one event loop), given the share of the load each serves; the broker's JVM has no per-process limit.
Ratios: ours×N ÷ Kafka and ours×N ÷ ours×1 for heartbeats/s and for that capacity, Kafka ÷ ours×N for server CPU
per heartbeat. On a shared machine the measured rates mostly show how the kernel split the cores between the
bench and everyone else (the load average and the rest of the machine's share are printed with every window);
CPU per heartbeat and the capacity derived from it are the figures that hold across loads.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.coordinator import (INITIAL_DELAY_MS, MIN_SESSION_MS, close_all, compiled_c_tool, connect_many, form_group,
                               leave_all, median_of)
from bench.wire import heartbeat_frame
from coordinator.embedded import EmbeddedKafka, kafka_version
from coordinator.loadgen import wire
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from protocol.errors import ConnectionClosed, RequestTimedOut

HEARTBEAT_SESSION_MS = 1_200_000  # members stay alive while other servers are measured (Kafka allows 30 min)
COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR = Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR
LOAD_IN_PROGRESS = Errors.COORDINATOR_LOAD_IN_PROGRESS
READY_TIMEOUT_S = 180
HBLOAD_SOURCE = Path(__file__).with_name("hbload.c")


# ---------------------------------------------------------------------------------------------- servers


@dataclass
class ServerSet:
    """One server under test: its processes (pids) and its listeners (ports)."""

    name: str
    ports: list[int]
    pids: list[int]
    shared: bool = False  # instances sharing one state topic (multi-instance mode)
    processes: list[subprocess.Popen] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def supports_instances() -> bool:
    """Whether this build's `coordinator serve` has multi-instance mode."""
    result = subprocess.run([sys.executable, "-m", "coordinator.cli", "serve", "--help"], capture_output=True,
                            text=True, check=False)
    return "--instance-id" in result.stdout


async def start_instances(count: int, bootstrap: str, cluster: bool, log_dir: Path) -> ServerSet:
    """`count` coordinator processes; with `cluster`, one state topic shared through --instance-id."""
    topic = f"__bench_state_{uuid.uuid4().hex[:6]}"
    name = f"ours×{count}"
    servers = ServerSet(name, [], [], shared=cluster)
    for k in range(1, count + 1):
        port = free_port()
        command = [sys.executable, "-m", "coordinator.cli", "--log-level", "WARNING", "serve",
                   "--listen", f"127.0.0.1:{port}", "--bootstrap-server", bootstrap, "--no-relay",
                   "--state-topic", topic if cluster else f"{topic}_{k}", "--event-topic", "",
                   "--config", f"group.initial.rebalance.delay.ms={INITIAL_DELAY_MS}",
                   "--config", f"group.min.session.timeout.ms={MIN_SESSION_MS}"]
        if cluster:
            command += ["--instance-id", f"i{k}"]
        log_file = open(log_dir / f"{name}-i{k}.log", "w")  # noqa: SIM115 (closed with the process)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_file, text=True)
        servers.processes.append(process)
        servers.ports.append(port)
        servers.pids.append(process.pid)
    for process in servers.processes:
        line = await asyncio.to_thread(process.stdout.readline)  # type: ignore[union-attr]
        if "listening on" not in line:
            raise RuntimeError(f"coordinator serve did not start: {line!r} (logs in {log_dir})")
    await wait_until_owned(servers)
    return servers


def stop(servers: ServerSet) -> None:
    for process in servers.processes:
        process.terminate()
    for process in servers.processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def find_owner(client: KafkaClient, group_id: str) -> int | None:
    """The port FindCoordinator names for `group_id`, or None while no one owns it (partition moving)."""
    response = await client.request(wire.find_coordinator(client, group_id), timeout_ms=30_000)
    if response.error_code in (COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, LOAD_IN_PROGRESS):
        return None
    if response.error_code:
        raise RuntimeError(f"FindCoordinator({group_id}): error {response.error_code}")
    return int(response.port)


async def owners_of(clients: list[KafkaClient], group_ids: list[str]) -> dict[str, int | None]:
    """Each group's owner, asked of the servers' listeners in turn (any instance must know every owner)."""
    answers = await asyncio.gather(*(find_owner(clients[i % len(clients)], g) for i, g in enumerate(group_ids)))
    return dict(zip(group_ids, answers))


async def wait_until_owned(servers: ServerSet) -> None:
    """Until FindCoordinator answers every probe key and the answers hold for 2 s; with shared ownership, until
    every instance gives the same answers and each instance owns some of the keys.

    With several instances the state topic's partitions are assigned and may move once more (cooperative-sticky
    rebalances in rounds); groups formed before that would be unloaded from under the benchmark."""
    probes = [f"probe-{i}" for i in range(200)]
    clients = [await KafkaClient.connect("127.0.0.1", port, client_id="bench") for port in servers.ports]
    try:
        deadline, previous, steady_since = time.monotonic() + READY_TIMEOUT_S, None, time.monotonic()
        while time.monotonic() < deadline:
            views = [await owners_of([client], probes) for client in clients]
            if servers.shared:
                settled = (all(None not in v.values() for v in views) and all(v == views[0] for v in views)
                           and set(views[0].values()) == set(servers.ports))
            else:  # each plain instance coordinates every group sent to it
                settled = all(set(v.values()) == {port} for v, port in zip(views, servers.ports))
            if not settled or views != previous:
                steady_since = time.monotonic()
            elif time.monotonic() - steady_since >= 2.0:
                return
            previous = views if settled else None
            await asyncio.sleep(0.5)
        raise RuntimeError(f"{servers.name}: ownership did not settle in {READY_TIMEOUT_S} s")
    finally:
        await close_all(clients)


# ---------------------------------------------------------------------------------------------- groups


@dataclass
class Population:
    """The members formed on one server set: heartbeat frames by the port that owns their group."""

    frames: dict[int, list[bytes]]
    formed: list[tuple[int, str, list[str]]]  # (port, group, member ids): to leave at the end


async def form_population(servers: ServerSet, args: argparse.Namespace) -> Population:
    """`groups` Stable groups, each formed on the listener FindCoordinator names for it.

    Candidate group ids are located first (half again as many as needed: a group that does not form in one
    generation is abandoned and formed under a spare id owned by the same server)."""
    size, wanted = args.group_size, args.groups
    prefix = f"hb-{uuid.uuid4().hex[:6]}"
    candidates = [f"{prefix}-{i}" for i in range(wanted + wanted // 2 + 10)]
    askers = [await KafkaClient.connect("127.0.0.1", port, client_id="bench") for port in servers.ports]
    try:
        owners = await owners_of(askers, candidates)
    finally:
        await close_all(askers)
    by_port: dict[int, list[str]] = defaultdict(list)
    for group_id, port in owners.items():
        if port is None:
            raise RuntimeError(f"{servers.name}: no owner for {group_id} after ownership settled")
        by_port[port].append(group_id)
    # the first `wanted` candidates are the groups; the rest are each server's spares
    quota: dict[int, int] = defaultdict(int)
    for group_id in candidates[:wanted]:
        quota[owners[group_id]] += 1  # type: ignore[index]
    population = Population(defaultdict(list), [])
    pool_size = max(size, min(max(args.connections), wanted * size) // len(by_port))
    for port, group_ids in by_port.items():
        pool = await connect_many(port, pool_size)
        spares = iter(group_ids[quota[port]:])
        try:
            wave = max(1, pool_size // size)
            mine = group_ids[:quota[port]]
            for start in range(0, len(mine), wave):
                batch = mine[start:start + wave]
                results = await asyncio.gather(*(
                    form_group(pool[i * size:(i + 1) * size], group_id, HEARTBEAT_SESSION_MS, spares=spares)
                    for i, group_id in enumerate(batch)))
                for group_id, joined in results:
                    population.formed.append((port, group_id, [j.member_id for j in joined]))
                    population.frames[port].extend(heartbeat_frame(group_id, j.generation_id, j.member_id)
                                                   for j in joined)
        finally:
            await close_all(pool)
        print(f"  {servers.name}: {quota[port]} groups on port {port}", file=sys.stderr, flush=True)
    return population


async def leave_population(population: Population) -> None:
    by_port: dict[int, list[tuple[str, list[str]]]] = defaultdict(list)
    for port, group_id, member_ids in population.formed:
        by_port[port].append((group_id, member_ids))
    for port, groups in by_port.items():
        try:
            client = await KafkaClient.connect("127.0.0.1", port, client_id="bench")
        except OSError:
            continue
        try:
            for group_id, member_ids in groups:
                await leave_all(client, group_id, member_ids)
        except (ConnectionClosed, RequestTimedOut):
            pass
        finally:
            await client.close()


# ---------------------------------------------------------------------------------------------- load


def plan_connections(frames: dict[int, list[bytes]], connections: int) -> list[tuple[int, list[bytes]]]:
    """`connections` connections divided among the ports in proportion to their members (at least one each);
    each cycles through its share of its port's members."""
    total = sum(len(f) for f in frames.values())
    plan = []
    for port, port_frames in sorted(frames.items()):
        count = max(1, min(len(port_frames), round(connections * len(port_frames) / total)))
        plan += [(port, port_frames[i::count]) for i in range(count)]
    return plan


def hbload_binary() -> Path:
    """bench/hbload.c, compiled once per source version."""
    return Path(compiled_c_tool(HBLOAD_SOURCE.name, "bench.instances needs a C compiler for its load generator "
                                                    "(apt-get install gcc), or --client python"))


async def run_load(plan: list[tuple[int, list[bytes]]], pids: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Run the load generator over `plan`; its JSON line (answers, latencies, CPU of itself and of `pids`)."""
    with tempfile.NamedTemporaryFile("w", suffix=".plan", delete=False) as plan_file:
        for port, frames in plan:
            plan_file.write(f"{port} {len(frames)}\n")
            plan_file.writelines(frame.hex() + "\n" for frame in frames)
    try:
        if args.client == "c":
            command = [str(hbload_binary())]
        else:
            command = [sys.executable, "-m", "bench.instances", "--drive"]
        command += [plan_file.name, str(args.warmup), str(args.seconds), ",".join(map(str, pids)) or "-"]
        process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
        stdout, _ = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"load generator failed (exit {process.returncode})")
        return json.loads(stdout.decode().strip().splitlines()[-1])
    finally:
        os.unlink(plan_file.name)


async def measure(servers: ServerSet, others: list[int], population: Population, connections: int,
                  args: argparse.Namespace) -> dict[str, Any]:
    plan = plan_connections(population.frames, connections)
    result = await run_load(plan, servers.pids + others, args)
    elapsed, answers = result["elapsed_s"], max(result["answers"], 1)
    cpu = {int(pid): seconds for pid, seconds in result["pid_cpu_s"].items()}
    server_cpu = sum(cpu[pid] for pid in servers.pids)
    other_cpu = sum(cpu[pid] for pid in others)
    client_cpu = result["client_cpu_s"]
    rest = result["machine_busy_s"] - server_cpu - other_cpu - client_cpu  # other users of the machine
    server_us, client_us = server_cpu / answers * 1e6, client_cpu / answers * 1e6
    # What these CPU costs allow when the machine is the bench's alone: the servers and the client share its cores
    # (less what the bench's other processes use meanwhile), and one of our instances runs its requests on one
    # thread (one core at most); the broker's JVM has no such limit.
    capacity = (os.cpu_count() - other_cpu / elapsed) / (server_us + client_us) * 1e6
    if servers.name != "kafka":
        by_port = {int(port): count for port, count in result["port_answers"].items()}
        for port, pid in zip(servers.ports, servers.pids):
            if by_port.get(port):
                fraction, us_each = by_port[port] / answers, cpu[pid] / by_port[port] * 1e6
                capacity = min(capacity, 1e6 / (us_each * fraction))
    return {"heartbeats_per_s": round(result["answers"] / elapsed),
            "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"],
            "server_cpu_us_per_heartbeat": round(server_us, 2),
            "client_cpu_us_per_heartbeat": round(client_us, 2),
            "server_cpu_share": round(server_cpu / elapsed, 2),
            "client_cpu_share": round(client_cpu / elapsed, 2),
            "others_cpu_share": round(other_cpu / elapsed, 2),
            "rest_of_machine_cpu_share": round(rest / elapsed, 2),
            "per_process_cpu_share": [round(cpu[pid] / elapsed, 2) for pid in servers.pids],
            "cpu_bound_capacity_per_s": round(capacity),
            "error_responses": result["errors"], "connections_closed": result["closed"],
            "load_average_1m": round(os.getloadavg()[0], 1)}


# ---------------------------------------------------------------------------------------------- python client


def drive_main(plan_path: str, warmup_s: float, seconds: float, pids: str) -> None:
    """`--client python`: the asyncio load generator of bench/wire.py over a plan, printing hbload's JSON line."""
    import resource

    import uvloop

    from bench.wire import LoadConnection, Stats, _process_cpu_s

    plan: list[tuple[int, list[bytes]]] = []
    with open(plan_path) as lines:
        for header in lines:
            port, count = map(int, header.split())
            plan.append((port, [bytes.fromhex(next(lines).strip()) for _ in range(count)]))
    pid_list = [int(p) for p in pids.split(",")] if pids != "-" else []

    def own_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def machine_busy() -> float:
        with open("/proc/stat") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:9]]
        return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait

    async def drive() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        stats = {port: Stats() for port, _frames in plan}
        protocols = []
        for port, frames in plan:
            _transport, protocol = await loop.create_connection(functools.partial(LoadConnection, frames, stats[port]),
                                                                "127.0.0.1", port)
            protocols.append(protocol)
        for protocol in protocols:
            protocol.send_next()
        await asyncio.sleep(warmup_s)
        before = own_cpu(), machine_busy(), [_process_cpu_s(pid) for pid in pid_list]
        started = time.perf_counter()
        for each in stats.values():
            each.measuring = True
        await asyncio.sleep(seconds)
        for each in stats.values():
            each.measuring = False
        elapsed = time.perf_counter() - started
        after = own_cpu(), machine_busy(), [_process_cpu_s(pid) for pid in pid_list]
        for each in stats.values():
            each.running = False
        for protocol in protocols:
            protocol.transport.close()
        latencies = sorted(latency for each in stats.values() for latency in each.latencies_ns)
        return {"answers": sum(each.count for each in stats.values()),
                "errors": sum(each.errors for each in stats.values()), "closed": 0, "elapsed_s": elapsed,
                "p50_ms": latencies[len(latencies) // 2] / 1e6 if latencies else -1,
                "p99_ms": latencies[int(len(latencies) * 0.99)] / 1e6 if latencies else -1,
                "client_cpu_s": after[0] - before[0], "machine_busy_s": after[1] - before[1],
                "pid_cpu_s": {str(pid): a - b for pid, a, b in zip(pid_list, after[2], before[2])},
                "port_answers": {str(port): each.count for port, each in stats.items()}}

    print(json.dumps(uvloop.run(drive())), flush=True)


# ---------------------------------------------------------------------------------------------- orchestration


def ratios(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kafka = results["kafka"]
    single = results.get("ours×1")
    for count in args.instances:
        ours = results[f"ours×{count}"]
        for connections in map(str, args.connections):
            mine, theirs = ours[connections], kafka[connections]
            entry = out.setdefault(f"ours×{count}", {}).setdefault(connections, {})
            entry["heartbeats_per_s_vs_kafka"] = round(mine["heartbeats_per_s"] / max(theirs["heartbeats_per_s"], 1), 3)
            entry["cpu_bound_capacity_vs_kafka"] = round(
                mine["cpu_bound_capacity_per_s"] / max(theirs["cpu_bound_capacity_per_s"], 1), 3)
            entry["kafka_cpu_per_heartbeat_over_ours"] = round(
                theirs["server_cpu_us_per_heartbeat"] / max(mine["server_cpu_us_per_heartbeat"], 1e-9), 3)
            if single is not None and count != 1:
                entry["heartbeats_per_s_vs_ours×1"] = round(
                    mine["heartbeats_per_s"] / max(single[connections]["heartbeats_per_s"], 1), 3)
                entry["cpu_bound_capacity_vs_ours×1"] = round(
                    mine["cpu_bound_capacity_per_s"] / max(single[connections]["cpu_bound_capacity_per_s"], 1), 3)
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.client == "c":
        hbload_binary()  # fail early without a compiler
    cluster = not args.independent and supports_instances()
    mode = "instances" if cluster else "independent"
    log_dir = Path(tempfile.mkdtemp(prefix="bench-instances-"))
    broker = EmbeddedKafka(extra_properties={
        "group.initial.rebalance.delay.ms": str(INITIAL_DELAY_MS),
        "group.min.session.timeout.ms": str(MIN_SESSION_MS)})
    await broker.start()
    sets: list[ServerSet] = []
    populations: dict[str, Population] = {}
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    try:
        kafka = ServerSet("kafka", [int(broker.bootstrap.rsplit(":", 1)[1])], [broker.pid or 0])
        sets.append(kafka)
        for count in args.instances:
            servers = await start_instances(count, broker.bootstrap, cluster, log_dir)
            sets.append(servers)
        for servers in sets:
            started = time.perf_counter()
            populations[servers.name] = await form_population(servers, args)
            print(f"{servers.name}: {args.groups} groups × {args.group_size} formed in "
                  f"{time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        if args.kafka_warmup > 0:  # the broker's JIT: a long-running broker has compiled its heartbeat path
            warm = argparse.Namespace(**{**vars(args), "warmup": args.kafka_warmup, "seconds": 1.0})
            await run_load(plan_connections(populations["kafka"].frames, max(args.connections)), [], warm)
        all_pids = [pid for s in sets for pid in s.pids]
        for repeat in range(args.repeats):
            order = sets if repeat % 2 == 0 else sets[::-1]  # interleaved: kafka, ours×1, ours×2, ours×2, ...
            for servers in order:
                figures = {}
                for connections in args.connections:
                    others = [pid for pid in all_pids if pid not in servers.pids]
                    figures[str(connections)] = await measure(servers, others, populations[servers.name],
                                                              connections, args)
                runs[servers.name].append(figures)
                print(f"repeat {repeat + 1} {servers.name}: {json.dumps(figures)}", file=sys.stderr, flush=True)
        for servers in sets:
            await leave_population(populations[servers.name])
    finally:
        for servers in sets[1:]:
            stop(servers)
        await broker.stop()
        broker.remove_data()
    medians = {name: median_of(figures) for name, figures in runs.items()}
    ratio = ratios(medians, args)
    load = os.getloadavg()
    print(f"\nmedians of {args.repeats} interleaved repeats, mode {mode}, client {args.client} on the same "
          f"{os.cpu_count()} CPUs, nothing pinned, load average at the end {load[0]:.1f}:")
    for connections in map(str, args.connections):
        print(f"  {connections} connections:")
        for name, figures in medians.items():
            f = figures[connections]
            print(f"    {name:<8} {f['heartbeats_per_s']:>8} hb/s  p50 {f['p50_ms']:>7} ms  p99 {f['p99_ms']:>8} ms  "
                  f"server {f['server_cpu_us_per_heartbeat']:>6} µs/hb ({f['server_cpu_share']} cores)  "
                  f"client {f['client_cpu_us_per_heartbeat']:>5} µs/hb ({f['client_cpu_share']})  "
                  f"bench's others {f['others_cpu_share']}, rest of machine {f['rest_of_machine_cpu_share']} cores  "
                  f"capacity {f['cpu_bound_capacity_per_s']}/s")
    for name, figures in medians.items():
        for connections, f in figures.items():
            if f["error_responses"] or f["connections_closed"]:  # counted as answers above: say so
                print(f"  WARNING {name} {connections} connections: {f['error_responses']} error answers, "
                      f"{f['connections_closed']} connections closed (see the logs in {log_dir})")
    for name, entries in ratio.items():
        for connections, entry in entries.items():
            print(f"  {name} {connections} connections: " + ", ".join(f"{k} {v}" for k, v in entry.items()))
    return {"bench": "instances", "mode": mode, "client": args.client, "kafka_version": kafka_version(),
            "cpus": os.cpu_count(), "groups": args.groups, "group_size": args.group_size,
            "seconds": args.seconds, "repeats": args.repeats, "load_average_1m": round(load[0], 1),
            "medians": medians, "ratio": ratio, "runs": runs, "logs": str(log_dir)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    numbers = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--instances", type=numbers, default=[1, 2], help="instance counts to measure (1,2)")
    parser.add_argument("--connections", type=numbers, default=[100, 1000])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--group-size", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per figure")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each figure")
    parser.add_argument("--kafka-warmup", type=float, default=10.0,
                        help="seconds of heartbeats to the broker before the first measurement (its JIT)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--client", choices=("c", "python"), default="c", help="load generator (see above)")
    parser.add_argument("--independent", action="store_true",
                        help="N separate single instances (a state topic each) even if --instance-id exists")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop", help="the orchestrator's loop")
    return parser.parse_args(argv)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--drive":
        drive_main(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
    else:
        from bench import run_and_print

        arguments = parse_args()
        run_and_print(main(arguments), arguments.loop)
