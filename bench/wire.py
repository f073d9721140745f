"""Wire benchmark: heartbeat round trips through the real server and GroupRuntime, against a bare asyncio
echo-frame server measured in the same run with the same load generator.

  python -m bench.wire [--loop asyncio|uvloop] [--seconds 3] [--members 1,100,10000] [--repeats 1] [--telemetry]
                       [--guarded] [--tls] [--acls] [--rate REQUESTS_PER_S]

For each member count two servers run in turn, each in its own process (pinned to CPU 0 when possible):
  bare:         an asyncio BufferedProtocol that answers every length-prefixed frame with a fixed 16-byte
                response (framing only: the practical ceiling of a Python asyncio server on this machine);
  coordinator:  our CoordinatorServer + GroupRuntime (in-memory store, real timer); its members are
                joined and synced in-process before the clock starts (setup is not what we measure), in
                groups of at most 100.
  coordinator+telemetry (--telemetry): the same with tracing and metrics on as `coordinator serve` runs them
                (see _start_telemetry); `ratio_to_telemetry_off` compares it with the plain coordinator run.
  coordinator+tls (--tls): the same behind an SSL listener (TLS 1.3, a test CA made for the run; the load
                generator's connections are TLS too): `cpu_ratio_to_plaintext` = our CPU per request over TLS /
                plaintext (docs/security.md's target: at most 1.3).
  coordinator+tls-loop (--tls): the same with the event loop's own TLS layer instead of ours
                (COORDINATOR_TLS_TRANSPORT=loop, coordinator/security/tls_transport.py), in the same run.
  coordinator+acls (--acls): the same with the cluster's ACLs enforced (coordinator/security/authorizer.py: 1,000
                ACLs, each group allowed by a prefixed READ, every Heartbeat checked): `cpu_ratio_to_unenforced` =
                our CPU per request with the checks / without.
  coordinator+guard (--guarded): the same behind the zombie guard of multi-instance mode
                (coordinator/cluster/ownership.py: a deadline check on every request, its tick task running);
                `ratio_to_unguarded` compares it with the plain coordinator run.
The load generator (this process, CPU 1) holds one connection per member up to 1,000 connections; above that
members share connections (10,000 members: 10 per connection, as a load generator's processes share them).
Each connection keeps one heartbeat in flight (closed loop), cycling through its members, so every request is
a Heartbeat v4 from a live member of a Stable group. Reported per run: requests/s, p50/p99 latency, and the
server's CPU time per request (from /proc), which does not depend on the load generator's speed.
`ratio_to_bare` compares requests/s; `cpu_ratio_to_bare` = bare CPU per request / ours, i.e. the share of the
bare ceiling we reach when the server's core is the limit (the more robust figure on a busy machine).
The machine is shared: runs are short and bounded (about 10 s per member count), loopback only.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import collections
import faulthandler
import functools
import json
import logging
import os
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

from protocol.fastpath import pack_heartbeat_request

HEARTBEAT_VERSION = 4
GROUP_SIZE = 100
MAX_CONNECTIONS = 1_000
SESSION_TIMEOUT_MS = 300_000
SETUP_TIMEOUT_S = 120
_BARE_RESPONSE = b"\x00\x00\x00\x0c"  # size 12: correlation id + 8 bytes, the shape of a Heartbeat v4 response
_BARE_RESPONSE_TAIL = b"\x00" * 8


# ---------------------------------------------------------------------------------------------- servers


class BareFrameServer(asyncio.BufferedProtocol):
    """Answers each frame with its correlation id and 8 zero bytes; no decoding at all."""

    def __init__(self) -> None:
        self.buffer = bytearray(256 * 1024)
        self.end = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buffer)[self.end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        buffer, start, out = self.buffer, 0, []
        while self.end - start >= 4:
            (size,) = struct.unpack_from(">i", buffer, start)
            if self.end - start - 4 < size:
                break
            out.append(_BARE_RESPONSE + buffer[start + 8 : start + 12] + _BARE_RESPONSE_TAIL)
            start += 4 + size
        if out:
            self.transport.write(b"".join(out))
        if start:
            buffer[: self.end - start] = buffer[start : self.end]
            self.end -= start


async def serve_bare() -> None:
    server = await asyncio.get_running_loop().create_server(BareFrameServer, "127.0.0.1", 0)
    print(json.dumps({"port": server.sockets[0].getsockname()[1], "members": []}), flush=True)
    await asyncio.Future()


async def serve_coordinator(member_count: int, telemetry: bool = False, guarded: bool = False,
                            tls_dir: str | None = None, acls: bool = False) -> None:
    from coordinator.config import CoordinatorConfig
    from coordinator.group.runtime import GroupRuntime
    from coordinator.group.observer import ObserverMux
    from coordinator.group.store import InMemoryGroupStore
    from coordinator.server import CoordinatorServer, ServerConfig
    from coordinator.timer import SystemTimer

    # Setup stalled once (1 run in ~40) at 100% CPU; if it ever does again, dump every stack and exit so the
    # run fails with evidence instead of hanging the orchestrator.
    faulthandler.dump_traceback_later(SETUP_TIMEOUT_S, exit=True)
    timer = SystemTimer("bench")
    timer.start()
    store = InMemoryGroupStore()
    observer = ObserverMux()
    coordinator = GroupRuntime(CoordinatorConfig(group_initial_rebalance_delay_ms=200), timer, store,
                                   observer=observer)
    instrumented = _start_telemetry(coordinator, observer, store) if telemetry else None
    groups = await asyncio.gather(*(
        _stable_group(coordinator, f"bench-{first // GROUP_SIZE}", min(GROUP_SIZE, member_count - first))
        for first in range(0, member_count, GROUP_SIZE)
    ))
    members = [member for group in groups for member in group]
    faulthandler.cancel_dump_traceback_later()
    server = CoordinatorServer(ServerConfig(listen_port=0, ssl_context=_server_tls(tls_dir)),
                               _guarded(coordinator) if guarded else coordinator,
                               authorizer=_enforcing_authorizer() if acls else None)
    await server.start()
    if instrumented is not None and instrumented.metrics is not None:
        instrumented.metrics.watch_connections(lambda: server.connection_count)
    print(json.dumps({"port": server.port, "members": members}), flush=True)
    await asyncio.Future()


def _enforcing_authorizer():
    """1,000 ACLs as a cluster might hold them: the bench groups (bench-N) allowed to everyone by a prefixed READ,
    among literal ACLs for other groups and topics."""
    from coordinator.security.authorizer import Acl, Acls, Authorizer, Operation, PatternType, Permission, ResourceType

    def acl(kind: ResourceType, name: str, pattern: PatternType) -> Acl:
        return Acl(kind, name, pattern, "User:*", "*", Operation.READ, Permission.ALLOW)

    noise = [acl(kind, f"other-{n}", PatternType.LITERAL) for n in range(499)
             for kind in (ResourceType.GROUP, ResourceType.TOPIC)]
    authorizer = Authorizer()
    authorizer.use(Acls([*noise, acl(ResourceType.GROUP, "bench-", PatternType.PREFIXED),
                         acl(ResourceType.TOPIC, "t", PatternType.LITERAL)]))
    return authorizer


def _server_tls(tls_dir: str | None):
    if tls_dir is None:
        return None
    from coordinator.security.listeners import Listener, server_ssl_context

    return server_ssl_context(Listener("SSL", "127.0.0.1", 0), {"ssl.keystore.location": f"{tls_dir}/broker.pem"})


def _client_tls(tls_dir: str | None):
    if tls_dir is None:
        return None
    import ssl

    return ssl.create_default_context(cafile=f"{tls_dir}/ca.pem")


def _guarded(runtime):
    """The runtime behind the zombie guard as multi-instance mode serves it, its deadline pushed by the tick task."""
    from coordinator.cluster.ownership import GuardedService, ZombieGuard
    from coordinator.timer import MonotonicClock

    guard = ZombieGuard(MonotonicClock(), 2_000, lambda stalled_ms: None)

    async def ticks() -> None:
        while True:
            guard.tick()
            await asyncio.sleep(0.5)

    _guarded.ticking = asyncio.get_running_loop().create_task(ticks())
    return GuardedService(runtime, guard)


def _start_telemetry(coordinator, observer, store):
    """Tracing and metrics as `coordinator serve` runs them: spans through the batch processor into an exporter
    that encodes them as OTLP protobuf and drops the bytes (the network send is not on the loop), metrics read by
    a Prometheus scrape of our own endpoint every second (a pessimistic scraper)."""
    import threading
    import urllib.request

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from coordinator.telemetry.otel import start_telemetry
    from coordinator.telemetry.service import instrument

    class EncodingSink(SpanExporter):
        def export(self, spans):
            encode_spans(spans).SerializeToString()
            return SpanExportResult.SUCCESS

    telemetry = start_telemetry(("127.0.0.1", 0), env={}, trace_exporter=EncodingSink())
    host, port = telemetry.metrics_address

    def scrape() -> None:
        while True:
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
                response.read()
            time.sleep(1.0)

    if not os.environ.get("BENCH_NO_SCRAPE"):
        threading.Thread(target=scrape, name="scraper", daemon=True).start()
    return instrument(telemetry, coordinator, observer, store)


async def _stable_group(coordinator, group_id: str, size: int) -> list[tuple[str, int, str]]:
    """Join `size` members concurrently (one generation), sync them; returns (group, generation, member)."""
    from coordinator.group import api

    def join_request(member_id: str) -> api.JoinGroupRequest:
        return api.JoinGroupRequest(group_id, SESSION_TIMEOUT_MS, 60_000, member_id, None, "consumer",
                                    [api.JoinGroupProtocol("range", b"")], version=9, client_id="bench",
                                    client_host="/127.0.0.1")

    first = [await coordinator.join_group(join_request("")) for _ in range(size)]
    joined = await asyncio.gather(*(coordinator.join_group(join_request(r.member_id)) for r in first))
    leader = joined[0].leader
    syncs = [
        api.SyncGroupRequest(group_id, r.generation_id, r.member_id, assignments=[
            api.SyncGroupRequestAssignment(m.member_id, b"") for m in r.members] if r.member_id == leader else [])
        for r in joined
    ]
    synced = await asyncio.gather(*(coordinator.sync_group(s) for s in syncs))
    assert all(s.error_code == 0 for s in synced), synced
    return [(group_id, r.generation_id, r.member_id) for r in joined]


# ---------------------------------------------------------------------------------------------- load


def heartbeat_frame(group_id: str, generation_id: int, member_id: str) -> bytes:
    """A Heartbeat v4 request frame, correlation id 0 (the load generator rewrites it per request)."""
    return pack_heartbeat_request(HEARTBEAT_VERSION, 0, "bench", group_id, generation_id, member_id)


class LoadConnection(asyncio.Protocol):
    """One request in flight; the next member's heartbeat leaves when the previous response arrives."""

    def __init__(self, frames: list[bytes], stats: Stats) -> None:
        self.frames = [bytearray(f) for f in frames]
        self.stats = stats
        self.next = 0
        self.pending = b""
        self.sent_ns = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def send_next(self) -> None:
        frame = self.frames[self.next]
        self.next = (self.next + 1) % len(self.frames)
        self.stats.correlation_id += 1
        struct.pack_into(">i", frame, 8, self.stats.correlation_id & 0x7FFFFFFF)
        self.sent_ns = time.perf_counter_ns()
        self.transport.write(frame)

    def data_received(self, data: bytes) -> None:
        self.pending += data
        if len(self.pending) < 4 or len(self.pending) < 4 + struct.unpack_from(">i", self.pending)[0]:
            return
        size = struct.unpack_from(">i", self.pending)[0]
        response, self.pending = self.pending[: 4 + size], self.pending[4 + size :]
        self.stats.record(time.perf_counter_ns() - self.sent_ns, response)
        if self.stats.running:
            if self.stats.pacer is not None:
                self.stats.pacer.waiting.append(self)
            else:
                self.send_next()


class Pacer:
    """--rate: the connections' next requests leave at most `rate` a second in all (released every millisecond),
    so servers whose clients cost more (TLS) and less (plaintext) are measured at the same request rate."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.waiting: collections.deque[LoadConnection] = collections.deque()
        self.credit = 0.0
        self.last = time.perf_counter()
        self.running = True

    def tick(self) -> None:
        now = time.perf_counter()
        self.credit = min(self.credit + (now - self.last) * self.rate, self.rate * 0.01)  # at most 10 ms' worth
        self.last = now
        waiting = self.waiting
        while waiting and self.credit >= 1:
            self.credit -= 1
            waiting.popleft().send_next()
        if self.running:
            asyncio.get_running_loop().call_later(0.001, self.tick)


@dataclass
class Stats:
    running: bool = True
    measuring: bool = False
    count: int = 0
    errors: int = 0
    correlation_id: int = 0
    pacer: Pacer | None = None

    def __post_init__(self) -> None:
        self.latencies_ns = array.array("q")

    def record(self, latency_ns: int, response: bytes) -> None:
        if not self.measuring:
            return
        self.count += 1
        if len(response) == 16 and response[13:15] != b"\x00\x00":  # Heartbeat v4 error code
            self.errors += 1
        if len(self.latencies_ns) < 2_000_000:
            self.latencies_ns.append(latency_ns)


async def drive(port: int, frames: list[bytes], seconds: float, warmup_s: float, server_pid: int,
                tls_dir: str | None = None, rate: float = 0.0) -> dict:
    loop = asyncio.get_running_loop()
    stats = Stats(pacer=Pacer(rate) if rate else None)
    connection_count = min(len(frames), MAX_CONNECTIONS)
    shares = [frames[i::connection_count] for i in range(connection_count)]
    connections = []
    for share in shares:
        _transport, protocol = await loop.create_connection(functools.partial(LoadConnection, share, stats), "127.0.0.1",
                                                            port, ssl=_client_tls(tls_dir))
        connections.append(protocol)
    if stats.pacer is not None:
        stats.pacer.waiting.extend(connections)
        stats.pacer.tick()
    else:
        for connection in connections:
            connection.send_next()
    await asyncio.sleep(warmup_s)
    cpu_before = _process_cpu_s(server_pid)
    started = time.perf_counter()
    stats.measuring = True
    await asyncio.sleep(seconds)
    stats.measuring = False
    elapsed = time.perf_counter() - started
    cpu_used = _process_cpu_s(server_pid) - cpu_before
    stats.running = False
    if stats.pacer is not None:
        stats.pacer.running = False
    await asyncio.sleep(0.2)
    for connection in connections:
        connection.transport.close()
    latencies = sorted(stats.latencies_ns)
    return {
        "connections": connection_count,
        "requests_per_s": round(stats.count / elapsed),
        "p50_ms": round(latencies[len(latencies) // 2] / 1e6, 3) if latencies else None,
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] / 1e6, 3) if latencies else None,
        "server_cpu_us_per_request": round(cpu_used / max(stats.count, 1) * 1e6, 2),
        "error_responses": stats.errors,
    }


def _process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


# ---------------------------------------------------------------------------------------------- orchestration


def _pin(cpu: int) -> None:
    try:
        os.sched_setaffinity(0, {cpu})
    except (AttributeError, OSError):
        pass


_TLS_KINDS = ("coordinator+tls", "coordinator+tls-loop")


def run_server(kind: str, members: int, loop_name: str, tls_dir: str | None = None) -> tuple[subprocess.Popen, dict]:
    command = [sys.executable, "-m", "bench.wire", "--serve", kind, "--members", str(members), "--loop", loop_name,
               *(("--tls-dir", tls_dir) if kind in _TLS_KINDS and tls_dir else ())]
    environment = {**os.environ, "COORDINATOR_TLS_TRANSPORT": "loop" if kind == "coordinator+tls-loop" else "ours"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=environment)
    assert process.stdout is not None  # stdout=PIPE
    line = process.stdout.readline()
    if not line.startswith("{"):
        process.kill()
        raise RuntimeError(f"{kind} server did not start: {line!r}")
    return process, json.loads(line)


async def measure(kind: str, members: int, args: argparse.Namespace) -> dict:
    tls_dir = args.tls_dir if kind in _TLS_KINDS else None
    process, info = run_server(kind, members, args.loop, tls_dir)
    try:
        if kind == "bare":
            frames = [heartbeat_frame("bench-0", 1, f"member-{i}") for i in range(members)]
        else:
            frames = [heartbeat_frame(g, gen, m) for g, gen, m in info["members"]]
        result = await drive(info["port"], frames, args.seconds, args.warmup, process.pid, tls_dir, args.rate)
    finally:
        process.kill()
        process.wait()
    return {"server": kind, "members": members, **result}


async def best_of(repeats: int, kind: str, members: int, args: argparse.Namespace) -> dict:
    """The run with the most requests/s: on a shared machine the slower runs measure the neighbours."""
    runs = [await measure(kind, members, args) for _ in range(repeats)]
    return max(runs, key=lambda run: run["requests_per_s"])


async def best_of_alternating(repeats: int, kinds: tuple[str, ...], members: int, args: argparse.Namespace
                              ) -> list[dict]:
    runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for _ in range(repeats):
        for kind in kinds:
            runs[kind].append(await measure(kind, members, args))
    return [max(runs[kind], key=lambda run: run["requests_per_s"]) for kind in kinds]


async def main(args: argparse.Namespace) -> None:
    _pin(1)
    results = []
    for members in (int(m) for m in args.members.split(",")):
        bare = await best_of(args.repeats, "bare", members, args)
        variants = tuple(kind for kind, wanted in (("coordinator+telemetry", args.telemetry),
                                                  ("coordinator+guard", args.guarded),
                                                  ("coordinator+tls", args.tls),
                                                  ("coordinator+tls-loop", args.tls),
                                                  ("coordinator+acls", args.acls)) if wanted)
        # the variants alternate with the plain run, so the machine's varying load falls on all alike
        ours, *others = await best_of_alternating(args.repeats, ("coordinator", *variants), members, args)
        traced = next((r for r in others if r["server"] == "coordinator+telemetry"), None)
        guarded = next((r for r in others if r["server"] == "coordinator+guard"), None)
        over_tls = [r for r in others if r["server"] in _TLS_KINDS]
        enforced = next((r for r in others if r["server"] == "coordinator+acls"), None)
        ratio = ours["requests_per_s"] / bare["requests_per_s"] if bare["requests_per_s"] else 0.0
        ours["ratio_to_bare"] = round(ratio, 3)
        # what fraction of the bare server's capacity we keep when the server's CPU is the limit
        ours["cpu_ratio_to_bare"] = round(bare["server_cpu_us_per_request"] / ours["server_cpu_us_per_request"], 3)
        measured = [bare, ours]
        if guarded is not None:
            guarded["ratio_to_unguarded"] = round(guarded["requests_per_s"] / ours["requests_per_s"], 3)
            guarded["cpu_ratio_to_unguarded"] = round(
                ours["server_cpu_us_per_request"] / guarded["server_cpu_us_per_request"], 3)
            measured.append(guarded)
        for over_tls_run in over_tls:
            over_tls_run["ratio_to_plaintext"] = round(over_tls_run["requests_per_s"] / ours["requests_per_s"], 3)
            over_tls_run["cpu_ratio_to_plaintext"] = round(
                over_tls_run["server_cpu_us_per_request"] / ours["server_cpu_us_per_request"], 3)
            measured.append(over_tls_run)
        if enforced is not None:
            enforced["cpu_ratio_to_unenforced"] = round(
                enforced["server_cpu_us_per_request"] / ours["server_cpu_us_per_request"], 3)
            measured.append(enforced)
        if traced is not None:
            traced["ratio_to_telemetry_off"] = round(traced["requests_per_s"] / ours["requests_per_s"], 3)
            traced["cpu_ratio_to_telemetry_off"] = round(
                ours["server_cpu_us_per_request"] / traced["server_cpu_us_per_request"], 3)
            measured.append(traced)
        for result in measured:
            print(json.dumps(result), flush=True)
        results += measured
    our_runs = [r for r in results if r["server"] == "coordinator"]
    summary = {"benchmark": "wire", "loop": args.loop, "seconds": args.seconds, "repeats": args.repeats,
               "rate": args.rate or "free-running",
               "results": results, "min_ratio_to_bare": min(r["ratio_to_bare"] for r in our_runs),
               "min_cpu_ratio_to_bare": min(r["cpu_ratio_to_bare"] for r in our_runs)}
    traced_runs = [r for r in results if r["server"] == "coordinator+telemetry"]
    if traced_runs:  # the issue-9 target: tracing and metrics on lose at most 10% against off, same run
        summary["min_ratio_to_telemetry_off"] = min(r["ratio_to_telemetry_off"] for r in traced_runs)
        summary["min_cpu_ratio_to_telemetry_off"] = min(r["cpu_ratio_to_telemetry_off"] for r in traced_runs)
    tls_runs = [r for r in results if r["server"] == "coordinator+tls"]
    if tls_runs:  # TLS on our listener against plaintext, same run (docs/security.md: at most 1.3x CPU)
        summary["max_cpu_ratio_to_plaintext"] = max(r["cpu_ratio_to_plaintext"] for r in tls_runs)
        summary["max_cpu_ratio_to_plaintext_loop_tls"] = max(
            r["cpu_ratio_to_plaintext"] for r in results if r["server"] == "coordinator+tls-loop")
    acl_runs = [r for r in results if r["server"] == "coordinator+acls"]
    if acl_runs:  # the ACL checks on every request against none, same run
        summary["max_cpu_ratio_to_unenforced"] = max(r["cpu_ratio_to_unenforced"] for r in acl_runs)
    guarded_runs = [r for r in results if r["server"] == "coordinator+guard"]
    if guarded_runs:  # multi-instance mode's per-request check against none, same run
        summary["min_ratio_to_unguarded"] = min(r["ratio_to_unguarded"] for r in guarded_runs)
        summary["min_cpu_ratio_to_unguarded"] = min(r["cpu_ratio_to_unguarded"] for r in guarded_runs)
    print(json.dumps(summary), flush=True)


def install_loop(name: str) -> str:
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:
            return "asyncio"
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        return "uvloop"
    return "asyncio"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--members", default="1,100,10000")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--telemetry", action="store_true",
                        help="also run the coordinator with tracing and metrics on (ratio against off, same run)")
    parser.add_argument("--guarded", action="store_true",
                        help="also run the coordinator behind multi-instance mode's zombie guard (ratio against "
                             "unguarded, same run)")
    parser.add_argument("--tls", action="store_true",
                        help="also run the coordinator behind an SSL listener, with our TLS layer and with the loop's "
                             "(CPU ratio against plaintext, same run; needs the `cryptography` package of the test "
                             "extra)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="requests/s in all, the same for every server (0: each as fast as the load generator "
                             "goes); below the slowest server's free-running rate, CPU per request is compared at "
                             "one request rate")
    parser.add_argument("--acls", action="store_true",
                        help="also run the coordinator with the cluster's ACLs enforced (CPU ratio against none, "
                             "same run)")
    parser.add_argument("--serve", choices=("bare", "coordinator", "coordinator+telemetry", "coordinator+guard",
                                            *_TLS_KINDS, "coordinator+acls"), help=argparse.SUPPRESS)
    parser.add_argument("--tls-dir", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    arguments.loop = install_loop(arguments.loop)
    if arguments.serve:
        _pin(0)
        logging.basicConfig(level=logging.ERROR)  # setup logs a line per member; not what we measure
        members_to_serve = int(arguments.members)
        asyncio.run(serve_bare() if arguments.serve == "bare" else
                    serve_coordinator(members_to_serve, telemetry=arguments.serve == "coordinator+telemetry",
                                      guarded=arguments.serve == "coordinator+guard", tls_dir=arguments.tls_dir,
                                      acls=arguments.serve == "coordinator+acls"))
    else:
        if arguments.tls and arguments.tls_dir is None:
            import tempfile
            from pathlib import Path

            from coordinator.embedded.certificates import make_test_certificates

            arguments.tls_dir = str(make_test_certificates(Path(tempfile.mkdtemp(prefix="bench-tls-"))).directory)
        asyncio.run(main(arguments))
