"""Soak: N members in groups heartbeating on a fixed schedule against one coordinator for a duration.

  python -m bench.soak --members 100000 [--group-size 10] [--interval-s 10] [--session-ms 30000]
                       [--duration-s 600] [--workers 2] [--server memory|service|serve|kafka] [--gc-freeze-every 1]
                       [--connect-window N] [--time-callbacks]

What it does, bounded in time and count:
1. Starts the server in its own process: `memory` runs our CoordinatorServer + GroupRuntime with the
   in-memory store (no Kafka: the heartbeat path does not touch storage); `service` runs `coordinator serve`
   (embedded Kafka, or --bootstrap-server). Either way the server runs coordinator/runtime_health.py and logs an
   `event=runtime_health` line every 5 s, which this script reads (loop lag, collector pauses of the server;
   with --time-callbacks the longest loop callback of each window, named). `kafka` runs Kafka's own group
   coordinator (the embedded broker) under the same generator, the anchor the other figures are ratios to.
2. Forms the groups like consumers do after a coordinator restart: every member of a wave opens its own
   connection (from several loopback source addresses, so 100k connections do not run out of ports),
   JoinGroup (KIP-394 member id round trip), SyncGroup (the leader assigns). At most --connect-window
   connections wait to be accepted at any time (opened, first answer not yet in), so the wave follows the
   server's accept rate instead of overflowing its listen queue; the shared heartbeat connections, opened
   before forming, are paced by the same window. The kernel's ListenOverflows and
   ListenDrops counters (/proc/net/netstat) are read before and after: a listen-queue overflow is counted here.
   A member that synced closes its forming connection and joins the heartbeat schedule at once.
3. Heartbeats: each member every `interval_s` at a fixed phase (evenly spread), Heartbeat v4 frames encoded once,
   sent over shared connections (`--members-per-connection`, raw asyncio protocols, responses matched in order).
   The generator runs in `--workers` processes and prints its own CPU use and how late its schedule ran: if
   it is late or near a full core, the figures measure the generator, not the server. A member whose heartbeat
   is answered REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID rejoins as Kafka's consumer does
   (JoinGroup + SyncGroup over a connection of its own, then back on its schedule); rejoins are counted, and
   members still rejoining at the end are reported, so a rebalance does not silently shrink the load.
4. After forming and `--warmup-s`, measures for `--duration-s`: answer latency p50/p99/max (every answer),
   server loop lag max, collector pauses, server CPU per heartbeat, RSS trend (start/middle/end of the
   measurement), heartbeat errors and false expirations (the server's "has failed, removing it" lines: every
   member is healthy, so every expiration is false). Progress every 10 s; a summary; a final JSON line.
5. Every process it starts (server, generator workers, the broker JVM) runs in its own process group and dies
   with the soak (PR_SET_PDEATHSIG); SIGTERM, SIGHUP or Ctrl-C stop and reap them all (bounded: SIGTERM, then
   SIGKILL to the process group) before the soak exits (128 + the signal, or with a summary when Ctrl-C ends
   the measurement).
"""
from __future__ import annotations

import argparse
import array
import asyncio
import bisect
import collections
import contextlib
import json
import logging
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from coordinator.embedded.broker import die_with_parent
from protocol.fastpath import pack_heartbeat_request

HEARTBEAT_VERSION = 4
TICK_S = 0.005
REPORT_S = 10.0
_SOURCE_ADDRESSES = [f"127.0.{i // 250}.{2 + i % 250}" for i in range(32)]  # 32 × ~28k ephemeral ports
_RESPONSE = struct.Struct(">iiBih")  # size, correlation id, header tags, throttle, error (then body tags)
_RESPONSE_BYTES = 16
_COORDINATOR_MOVING = (14, 15, 16)  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR
_UNKNOWN_MEMBER_ID = 25
# heartbeat answers a consumer rejoins on: ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS
_REJOIN_ON = frozenset((22, _UNKNOWN_MEMBER_ID, 27))


def raise_fd_limit() -> int:
    """Open-file limit to the maximum this process may set (with CAP_SYS_RESOURCE: fs.nr_open)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        with open("/proc/sys/fs/nr_open") as f:
            nr_open = int(f.read())
        resource.setrlimit(resource.RLIMIT_NOFILE, (nr_open, nr_open))
        return nr_open
    except (OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard


# ---------------------------------------------------------------------------------------------- latency


class Histogram:
    """Microsecond latencies: 10 µs buckets to 100 ms, then 1 ms buckets to 120 s (exact max kept aside)."""

    FINE, FINE_US = 10_000, 10
    COARSE, COARSE_US = 120_000, 1_000

    def __init__(self) -> None:
        self.counts = array.array("q", bytes(8 * (self.FINE + self.COARSE)))
        self.total = 0
        self.max_us = 0

    def add(self, us: int) -> None:
        if us < self.FINE * self.FINE_US:
            self.counts[us // self.FINE_US] += 1
        else:
            self.counts[self.FINE + min(us // self.COARSE_US, self.COARSE - 1)] += 1
        self.total += 1
        if us > self.max_us:
            self.max_us = us

    def merge(self, sparse: dict[str, int], total: int, max_us: int) -> None:
        for index, count in sparse.items():
            self.counts[int(index)] += count
        self.total += total
        self.max_us = max(self.max_us, max_us)

    def sparse(self) -> dict[str, int]:
        return {str(i): c for i, c in enumerate(self.counts) if c}

    def percentile_ms(self, q: float) -> float:
        if not self.total:
            return 0.0
        rank, seen = q * self.total, 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                upper_us = ((index + 1) * self.FINE_US if index < self.FINE
                            else (index - self.FINE + 1) * self.COARSE_US)
                return min(upper_us, self.max_us) / 1000
        return self.max_us / 1000


# ---------------------------------------------------------------------------------------------- generator


class HeartbeatMember:
    """One member on the heartbeat schedule: its connection and its pre-encoded Heartbeat frame, re-encoded after a
    rejoin; while it rejoins it sends no heartbeats (its JoinGroup keeps it in the group meanwhile)."""

    __slots__ = ("index", "group_id", "member_id", "generation", "conn", "frame", "rejoining")

    def __init__(self, index: int, group_id: str, conn: HeartbeatConnection) -> None:
        self.index, self.group_id, self.conn = index, group_id, conn
        self.member_id, self.generation, self.frame = "", -1, b""
        self.rejoining = False

    def synced(self, generation: int, member_id: str) -> None:
        self.generation, self.member_id = generation, member_id
        self.frame = pack_heartbeat_request(HEARTBEAT_VERSION, self.index & 0x7FFFFFFF, "soak", self.group_id,
                                            generation, member_id)
        self.rejoining = False


class HeartbeatConnection(asyncio.Protocol):
    """Pipelined heartbeats; answers come in request order, so a FIFO of (send time, member, frame) matches them."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.sent: collections.deque[tuple[int, HeartbeatMember, bytes]] = collections.deque()
        self.pending = b""
        self.transport: asyncio.Transport | None = None
        self.lost = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    async def accepted(self) -> None:
        """Until the server answers a heartbeat sent now over this connection, of a member no group has (its error
        asks for nothing): the server has accepted this connection, and, accepting in order, every one opened
        before it."""
        probe = HeartbeatMember(0, "soak-accept-probe", self)
        probe.synced(-1, "soak-accept-probe")
        probe.rejoining = True  # an answer's error does not start a rejoin
        self.send(probe, time.perf_counter_ns())
        while self.sent and not self.lost:
            await asyncio.sleep(0.002)

    def send(self, member: HeartbeatMember, now_ns: int) -> None:
        if self.transport is None or self.lost:
            return
        self.sent.append((now_ns, member, member.frame))
        self.transport.write(member.frame)

    def data_received(self, data: bytes) -> None:
        now_ns = time.perf_counter_ns()
        if self.pending:
            data, self.pending = self.pending + data, b""
        usable = len(data) - len(data) % _RESPONSE_BYTES
        worker, sent = self.worker, self.sent
        for offset in range(0, usable, _RESPONSE_BYTES):
            error = _RESPONSE.unpack_from(data, offset)[4]
            sent_ns, member, frame = sent.popleft()
            worker.answer((now_ns - sent_ns) // 1000, error, member, frame)
        if usable != len(data):
            self.pending = data[usable:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.worker.connections_lost += 1


@dataclass
class Worker:
    """One generator process: forms its share of the groups, then heartbeats for them on schedule, and rejoins a
    member as a consumer does when a heartbeat says its group rebalances or forgot it."""

    host: str
    port: int
    groups: list[str]
    group_size: int
    interval_s: float
    session_ms: int
    members_per_connection: int
    form_wave: int
    connect_window: int
    reports_progress: bool = False
    measuring: bool = False
    hist: Histogram = field(default_factory=Histogram)
    window_max_us: int = 0
    window_count: int = 0
    window_slow: int = 0
    errors: collections.Counter = field(default_factory=collections.Counter)
    connections_lost: int = 0
    schedule_late_max_ms: float = 0.0
    rejoins: collections.Counter = field(default_factory=collections.Counter)  # heartbeat error -> rejoins it caused
    rejoins_measured: int = 0
    rejoin_failures: int = 0
    rejoin_first_error: str | None = None
    rejoin_tasks: set[asyncio.Task] = field(default_factory=set)
    # A rejoin storm (a server too slow to answer heartbeats) must not open a connection per member: the process
    # would reach its open-file limit and stop forming. The members beyond the window wait, off the schedule.
    rejoin_window: int = 1024
    rejoin_connections: asyncio.Semaphore | None = None

    def answer(self, us: int, error: int, member: HeartbeatMember, frame: bytes) -> None:
        # an answer to a heartbeat of an older generation (sent before a rejoin) asks for nothing, as in Kafka's
        # consumer, which ignores it once its generation changed
        if error and error in _REJOIN_ON and not member.rejoining and frame is member.frame:
            self.start_rejoin(member, error)
        if not self.measuring:
            return
        if error:
            self.errors[error] += 1
        self.hist.add(us)
        self.window_count += 1
        if us > self.window_max_us:
            self.window_max_us = us
        if us > 20_000:
            self.window_slow += 1

    def start_rejoin(self, member: HeartbeatMember, error: int) -> None:
        """As Kafka's consumer: REBALANCE_IN_PROGRESS and ILLEGAL_GENERATION rejoin with the member id,
        UNKNOWN_MEMBER_ID rejoins as a new member (the coordinator no longer knows the id)."""
        member.rejoining = True
        if error == _UNKNOWN_MEMBER_ID:
            member.member_id = ""
        self.rejoins[error] += 1
        self.rejoins_measured += self.measuring
        task = asyncio.get_running_loop().create_task(self.rejoin(member))
        self.rejoin_tasks.add(task)
        task.add_done_callback(self.rejoin_tasks.discard)

    async def rejoin(self, member: HeartbeatMember) -> None:
        """JoinGroup + SyncGroup over a connection of the member's own until it is synced again (retried after a
        second on failure, as a client retries: the member stays off the schedule meanwhile)."""
        from protocol.client import KafkaClient

        loop = asyncio.get_running_loop()
        if self.rejoin_connections is None:
            self.rejoin_connections = asyncio.Semaphore(self.rejoin_window)
        while True:
            try:
                async with self.rejoin_connections:
                    _, client = await asyncio.wait_for(loop.create_connection(
                        lambda: KafkaClient("soak", 120_000), self.host, self.port,
                        local_addr=(_SOURCE_ADDRESSES[member.index % len(_SOURCE_ADDRESSES)], 0)), 60)
                    try:
                        generation, member_id = await join_and_sync(client, member.group_id, self, {}, {},
                                                                    collections.Counter(), member_id=member.member_id)
                    finally:
                        await client.close()
                member.synced(generation, member_id)
                return
            except Exception as exc:  # noqa: BLE001 - counted and retried, as a client retries
                self.rejoin_failures += 1
                self.rejoin_first_error = self.rejoin_first_error or repr(exc)
                await asyncio.sleep(1.0)

    def rejoin_figures(self) -> dict:
        return {"rejoins": {str(error): count for error, count in self.rejoins.items()},
                "rejoins_measured": self.rejoins_measured, "rejoin_failures": self.rejoin_failures,
                "rejoining": len(self.rejoin_tasks), "rejoin_first_error": self.rejoin_first_error}


def emit(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Generator:
    """A worker's heartbeat pool and schedule: `start` opens the shared connections, starts the schedule and forms
    the groups (each member joins the schedule once synced); `stop` ends the schedule and the rejoins."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.member_total = len(worker.groups) * worker.group_size
        self.pool: list[HeartbeatConnection] = []
        self.slots: list[list[HeartbeatMember]] = [[] for _ in range(max(1, int(worker.interval_s / TICK_S)))]
        self.members: list[HeartbeatMember] = []
        self.stopping = asyncio.Event()
        self.scheduler: asyncio.Task | None = None

    async def start(self) -> dict:
        from protocol.client import KafkaClient

        loop = asyncio.get_running_loop()
        worker = self.worker
        pool_size = max(1, -(-self.member_total // worker.members_per_connection))
        # Opened one after another as fast as the kernel completes handshakes, they would wait in the server's
        # listen queue faster than it accepts them (10,000 at 300k members: the queue full, SYNs dropped): at most
        # `connect_window` of them are opened before the server has answered on the last one, as forming paces.
        window = worker.connect_window or pool_size
        for i in range(pool_size):
            _, conn = await loop.create_connection(lambda: HeartbeatConnection(worker), worker.host, worker.port,
                                                   local_addr=(_SOURCE_ADDRESSES[i % len(_SOURCE_ADDRESSES)], 0))
            self.pool.append(conn)
            if (i + 1) % window == 0:
                await conn.accepted()
        self.scheduler = loop.create_task(schedule(worker, self.slots, self.stopping))
        return await form(worker, self.activate, KafkaClient)

    def activate(self, index: int, group_id: str, generation: int, member_id: str) -> None:
        member = HeartbeatMember(index, group_id, self.pool[index % len(self.pool)])
        member.synced(generation, member_id)
        self.members.append(member)
        # Evenly spread phases; the first heartbeat comes one phase after the sync, as a client's would.
        self.slots[(index * len(self.slots)) // max(self.member_total, 1)].append(member)

    async def stop(self) -> None:
        self.stopping.set()
        if self.scheduler is not None:
            await self.scheduler
        rejoins = list(self.worker.rejoin_tasks)
        for task in rejoins:
            task.cancel()
        await asyncio.gather(*rejoins, return_exceptions=True)
        for conn in self.pool:
            if conn.transport is not None:
                conn.transport.close()


async def run_worker(spec: dict) -> None:
    raise_fd_limit()
    loop = asyncio.get_running_loop()
    first, step, count = spec["groups"]
    worker = Worker(spec["host"], spec["port"], [f"soak-{i}" for i in range(first, count, step)],
                    spec["group_size"], spec["interval_s"],
                    spec["session_ms"], spec["members_per_connection"], spec["form_wave"], spec["connect_window"],
                    reports_progress=True)
    generator = Generator(worker)
    forming = await generator.start()
    emit({"formed": forming})

    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    reporter = loop.create_task(report(worker))
    while True:
        line = (await reader.readline()).decode().strip()
        if line == "measure":
            worker.measuring = True
            worker.hist = Histogram()
            worker.schedule_late_max_ms = 0.0
        elif line in ("stop", ""):
            break
    worker.measuring = False
    rejoin_figures = worker.rejoin_figures()  # before stopping: how many were still rejoining
    await generator.stop()
    reporter.cancel()
    emit({"final": {"hist": worker.hist.sparse(), "total": worker.hist.total, "max_us": worker.hist.max_us,
                    "errors": dict(worker.errors), "connections_lost": worker.connections_lost,
                    "active": len(generator.members), **rejoin_figures, "cpu_s": _cpu_s()}})


async def form(worker: Worker, activate, client_class) -> dict:
    """Joins every group of this worker, `form_wave` members at a time; returns forming figures.

    At most `connect_window` of this worker's connections are opened and not yet answered: an answer proves the
    server accepted the connection, so the window is what can wait in the server's listen queue, and the rate
    at which members connect follows the server's accept rate instead of overflowing the queue (somaxconn)."""
    loop = asyncio.get_running_loop()
    members = [(g, i) for g in worker.groups for i in range(worker.group_size)]
    started = time.monotonic()
    results: dict[str, Any] = {"members": 0, "failed": 0, "rejoins": 0, "connect_s_max": 0.0, "join_spread_s_max": 0.0}
    first_join: dict[str, float] = {}
    last_join: dict[str, float] = {}
    unanswered = asyncio.Semaphore(worker.connect_window or len(members) or 1)

    async def member(index: int, group_id: str) -> None:
        await unanswered.acquire()
        answered = False

        def accepted() -> None:
            nonlocal answered
            if not answered:
                answered = True
                unanswered.release()

        t0 = time.monotonic()
        try:
            _, client = await asyncio.wait_for(loop.create_connection(
                lambda: client_class("soak", 120_000), worker.host, worker.port,
                local_addr=(_SOURCE_ADDRESSES[index % len(_SOURCE_ADDRESSES)], 0)), 60)
        except (OSError, asyncio.TimeoutError):
            results["failed"] += 1
            accepted()
            return
        results["connect_s_max"] = max(results["connect_s_max"], time.monotonic() - t0)
        try:
            generation, member_id = await join_and_sync(client, group_id, worker, first_join, last_join, results,
                                                        accepted)
            activate(index, group_id, generation, member_id)
            results["members"] += 1
        except Exception as exc:  # noqa: BLE001 - counted and reported, the soak goes on
            results["failed"] += 1
            results.setdefault("first_error", repr(exc))
        finally:
            accepted()
            await client.close()

    index = 0
    for first in range(0, len(members), worker.form_wave):
        wave = members[first:first + worker.form_wave]
        await asyncio.gather(*(member(index + i, g) for i, (g, _) in enumerate(wave)))
        index += len(wave)
        if worker.reports_progress:  # a generator process: the soak prints forming progress from these
            emit({"forming_progress": {"members": results["members"], "failed": results["failed"],
                                       "of": len(members)}})
    results["join_spread_s_max"] = round(max((last_join[g] - first_join[g] for g in first_join), default=0), 3)
    results["connect_s_max"] = round(results["connect_s_max"], 3)
    results["seconds"] = round(time.monotonic() - started, 1)
    return results


async def join_and_sync(client, group_id: str, worker: Worker, first_join: dict, last_join: dict,
                        results: dict, answered: Callable[[], None] = lambda: None, *,
                        member_id: str = "") -> tuple[int, str]:
    """JoinGroup and SyncGroup until synced, answering errors as Kafka's consumer does: MEMBER_ID_REQUIRED joins
    again with the id given, UNKNOWN_MEMBER_ID as a new member, REBALANCE_IN_PROGRESS and ILLEGAL_GENERATION on
    the sync join again with the id; returns (generation, member id)."""
    from protocol.apis import ApiKey, request_class
    from protocol.consumer_protocol import Subscription, encode_subscription
    from protocol.error_codes import Errors
    from protocol.messages import build, item_class
    import datetime

    join_cls, sync_cls = request_class(ApiKey.JOIN_GROUP, 7), request_class(ApiKey.SYNC_GROUP, 5)
    protocol = item_class(join_cls, "protocols")(name="range", metadata=encode_subscription(Subscription(("t",))))
    assignment_cls = item_class(sync_cls, "assignments")
    for _attempt in range(20):
        now = time.monotonic()
        first_join.setdefault(group_id, now)
        last_join[group_id] = now
        joined = await client.request(build(
            join_cls, group_id=group_id, session_timeout=datetime.timedelta(milliseconds=worker.session_ms),
            rebalance_timeout=datetime.timedelta(milliseconds=60_000), member_id=member_id, group_instance_id=None,
            protocol_type="consumer", protocols=(protocol,), reason=None))
        answered()
        if joined.error_code == Errors.MEMBER_ID_REQUIRED:
            member_id = joined.member_id
            continue
        if joined.error_code == Errors.UNKNOWN_MEMBER_ID:
            member_id = ""
            continue
        if joined.error_code in _COORDINATOR_MOVING:  # a single broker: the same node, once it has loaded
            await asyncio.sleep(0.5)
            continue
        if joined.error_code:
            raise RuntimeError(f"JoinGroup error {int(joined.error_code)}")
        member_id = joined.member_id
        assignments = tuple(assignment_cls(member_id=m.member_id, assignment=b"")
                            for m in joined.members) if joined.leader == member_id else ()
        synced = await client.request(build(
            sync_cls, group_id=group_id, generation_id=joined.generation_id, member_id=member_id,
            group_instance_id=None, protocol_type="consumer", protocol_name="range", assignments=assignments))
        if synced.error_code in (Errors.REBALANCE_IN_PROGRESS, Errors.ILLEGAL_GENERATION):  # a member arrived late
            results["rejoins"] += 1
            continue
        if synced.error_code == Errors.UNKNOWN_MEMBER_ID:
            results["rejoins"] += 1
            member_id = ""
            continue
        if synced.error_code:
            raise RuntimeError(f"SyncGroup error {int(synced.error_code)}")
        return int(joined.generation_id), member_id
    raise RuntimeError("no stable generation after 20 joins")


async def schedule(worker: Worker, slots: list[list[HeartbeatMember]], stop: asyncio.Event) -> None:
    """Sends each slot's heartbeats at its time; slots missed by a stall are sent at once, late."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    tick = 0
    while not stop.is_set():
        due = start + tick * TICK_S
        now = loop.time()
        if due > now:
            await asyncio.sleep(due - now)
            now = loop.time()
        late_ms = (now - due) * 1000
        if worker.measuring and late_ms > worker.schedule_late_max_ms:
            worker.schedule_late_max_ms = late_ms
        now_ns = time.perf_counter_ns()
        for member in slots[tick % len(slots)]:
            if not member.rejoining:
                member.conn.send(member, now_ns)
        tick += 1


async def report(worker: Worker) -> None:
    last_cpu, last_t = _cpu_s(), time.monotonic()
    last_rejoins = 0
    while True:
        await asyncio.sleep(REPORT_S)
        cpu, t = _cpu_s(), time.monotonic()
        emit({"window": {"count": worker.window_count, "max_us": worker.window_max_us, "slow": worker.window_slow,
                         "errors": sum(worker.errors.values()), "cpu_pct": round(100 * (cpu - last_cpu) / (t - last_t), 1),
                         "schedule_late_max_ms": round(worker.schedule_late_max_ms, 1),
                         "rejoins": sum(worker.rejoins.values()) - last_rejoins,
                         "rejoining": len(worker.rejoin_tasks)}})
        last_rejoins = sum(worker.rejoins.values())
        worker.window_count = worker.window_max_us = worker.window_slow = 0
        last_cpu, last_t = cpu, t


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------------------------- servers


async def serve_memory(initial_delay_ms: int, listen_backlog: int | None) -> None:
    """Our server and coordinator with the in-memory store, and the service's runtime health wiring."""
    from coordinator.config import CoordinatorConfig
    from coordinator.group.runtime import GroupRuntime
    from coordinator.group.store import InMemoryGroupStore
    from coordinator.runtime_health import RuntimeHealth
    from coordinator.server import CoordinatorServer, ServerConfig
    from coordinator.timer import SystemTimer

    raise_fd_limit()
    health = RuntimeHealth.from_env()
    health.start()
    timer = SystemTimer("soak")
    timer.start()
    coordinator = GroupRuntime(CoordinatorConfig(group_initial_rebalance_delay_ms=initial_delay_ms), timer,
                                   InMemoryGroupStore())
    options: dict[str, Any] = {} if listen_backlog is None else {"listen_backlog": listen_backlog}
    server = CoordinatorServer(ServerConfig(listen_port=0, **options), coordinator)
    await server.start()
    logging.getLogger("coordinator.app").info("event=coordinator_ready port=%d", server.port)
    await asyncio.Future()


class Terminated(Exception):
    """SIGTERM or SIGHUP to the soak: it stops and reaps what it started, then exits 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by signal {signum}")
        self.signum = signum


def _raise_terminated(signum: int, _frame: Any) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """Teardown is not cut short by a second Ctrl-C or SIGTERM (it is bounded: every stop has a timeout)."""
    names = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in names}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _child_setup() -> None:
    """preexec_fn of every process the soak starts: the open-file limit raised, and SIGKILL when the soak dies
    without its teardown (SIGKILL to it); the service's broker JVM dies with its server the same way."""
    raise_fd_limit()
    die_with_parent()


def spawn(command: list[str], **options: Any) -> subprocess.Popen:
    """A child in its own process group: a terminal's Ctrl-C reaches the soak alone, which stops its children in
    order, and `stop_process` reaches whatever the child started in turn."""
    return subprocess.Popen(command, process_group=0, preexec_fn=_child_setup, **options)


def stop_process(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the child's process group, SIGKILL to the group after `grace_s` (at once with 0), the child reaped;
    what it started and left in its group is killed too."""
    if grace_s > 0 and proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc.pid, signal.SIGKILL)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:  # only a process stuck in the kernel outlives SIGKILL this long
        print(f"process {proc.pid} still there 10 s after SIGKILL", file=sys.stderr, flush=True)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the group is gone: nothing left to stop
        pass


class MeasuredProcess:
    """RSS and CPU time of the server under test, read from /proc (a JVM's every thread included)."""

    proc: subprocess.Popen

    def rss_mib(self) -> float:
        return process_rss_mib(self.proc.pid)

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)


class ServerProcess(MeasuredProcess):
    """The server under test, its log read by a thread: health figures, stalls, member failures."""

    STOP_GRACE_S = 45.0  # `coordinator serve` stops its embedded broker (Kafka's controlled shutdown) first

    HEALTH = re.compile(r"event=runtime_health (.*)")
    PAIR = re.compile(r"(\w+)=([-\d.]+)")

    def __init__(self, args: argparse.Namespace) -> None:
        env = dict(os.environ, COORDINATOR_HEALTH_LOG_INTERVAL_S="5",
                   COORDINATOR_GC_FREEZE_EVERY=str(args.gc_freeze_every),
                   COORDINATOR_TIME_CALLBACKS="1" if args.time_callbacks else "0")
        if args.server == "memory":
            command = [sys.executable, "-m", "bench.soak", "--serve-memory", "--event-loop", args.event_loop,
                       "--initial-delay-ms", str(args.initial_delay_ms)]
            if args.listen_backlog is not None:
                command += ["--listen-backlog", str(args.listen_backlog)]
            self.port = 0
        else:
            self.port = _free_port()
            command = [sys.executable, "-m", "coordinator.cli", "--event-loop", args.event_loop, "serve", "--listen", f"127.0.0.1:{self.port}",
                       "--config", f"group.initial.rebalance.delay.ms={args.initial_delay_ms}"]
            if args.server == "service":  # the members only join, sync and heartbeat: no topic of the cluster's
                command.append("--no-relay")  # is needed; `serve` keeps the relay on, as the service runs by default
            if args.bootstrap_server:
                command += ["--bootstrap-server", args.bootstrap_server]
            if args.listen_backlog is not None:
                command += ["--listen-backlog", str(args.listen_backlog)]
        self.proc = spawn(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.ready = threading.Event()
        self.health: dict[str, float] = {}
        self.window_lag_max_ms = 0.0
        self.window_busy_max_ms = 0.0
        self.window_gc_max_ms = 0.0
        self.measuring = False
        self.callbacks: dict[str, float] = {}  # while measuring: each window's longest callback, its max (ms)
        self.failures = 0
        self.stall_lines: list[str] = []
        self.warnings: list[str] = []  # other warnings and errors of the server, the first few
        self.tail: collections.deque[str] = collections.deque(maxlen=20)
        self.log = open(args.server_log, "w") if args.server_log else None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if self.log is not None:
                self.log.write(line)
                self.log.flush()
            self.tail.append(line.rstrip())
            if "has failed, removing it from the group" in line:
                self.failures += 1
            elif "event=coordinator_ready" in line:
                match = re.search(r"port=(\d+)", line)
                if match:
                    self.port = int(match.group(1))
                self.ready.set()
            elif (found := self.HEALTH.search(line)) is not None:
                values = {k: float(v) for k, v in self.PAIR.findall(found.group(1))}
                self.window_lag_max_ms = max(self.window_lag_max_ms, values.get("window_lag_max_ms", 0))
                self.window_gc_max_ms = max(self.window_gc_max_ms, values.get("window_gc_pause_max_ms", 0))
                self.window_busy_max_ms = max(self.window_busy_max_ms, values.get("window_busy_max_ms", 0))
                callback = re.search(r"window_callback=(\S+)", line)
                if self.measuring and callback is not None and callback.group(1) != "-":
                    name, ms = callback.group(1), values.get("window_callback_max_ms", 0.0)
                    self.callbacks[name] = max(self.callbacks.get(name, 0.0), ms)
                self.health = values
            elif "event=loop_stall" in line or "event=gc_pause" in line:
                if len(self.stall_lines) < 1000:
                    self.stall_lines.append(line.rstrip())
            elif (" WARNING " in line or " ERROR " in line) and len(self.warnings) < 10:
                self.warnings.append(line.rstrip())

    def take_window(self) -> tuple[float, float, float]:
        """(loop lag, loop busy, collector pause) maxima, ms, since the previous call."""
        values = self.window_lag_max_ms, self.window_busy_max_ms, self.window_gc_max_ms
        self.window_lag_max_ms = self.window_busy_max_ms = self.window_gc_max_ms = 0.0
        return values

    def stop(self) -> None:
        stop_process(self.proc, self.STOP_GRACE_S)


class KafkaServer(MeasuredProcess):
    """Kafka's own group coordinator under the same generator: the embedded broker (the release pinned in
    coordinator/embedded/pom.xml), JVM CPU and RSS from /proc, collector pauses from its -Xlog:gc file, false
    expirations from its log (the same "has failed, removing it from the group" line as ours). It has no loop
    to probe: lag and busy stretches stay 0 and are reported as None."""

    GC_PAUSE = re.compile(r"\] GC\(\d+\) Pause .* ([\d.]+)ms$")

    def __init__(self, args: argparse.Namespace) -> None:
        from coordinator.embedded import EmbeddedKafka

        self.data_dir = tempfile.mkdtemp(prefix="soak-kafka-")
        self.gc_log = os.path.join(self.data_dir, "gc.log")
        self.broker = EmbeddedKafka(os.path.join(self.data_dir, "broker"), heap_mb=args.kafka_heap_mb,
                                    jvm_options=[f"-Xlog:gc:file={self.gc_log}"], extra_properties={
            "group.initial.rebalance.delay.ms": str(args.initial_delay_ms),
            # ours asks the kernel for 65,535 (both capped at somaxconn); Kafka's default is 50
            "socket.listen.backlog.size": str(args.listen_backlog or 65_535),
            "group.max.size": str(max(args.group_size, 1_000))})
        self.health: dict[str, float] = {}
        self.failures = 0
        self.measuring = False  # set like ServerProcess's; nothing here reads it
        self.stall_lines: list[str] = []
        self.warnings: list[str] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=20)
        self.window_gc_max_ms = 0.0
        self.gc_pauses = 0
        self.ready = threading.Event()
        try:
            self.broker.start_blocking()
            assert self.broker._process is not None
            self.proc = self.broker._process
            self.port = self.broker.port
            asyncio.run(self._until_coordinating([f"soak-{i}" for i in range(args.members // args.group_size)],
                                                 args.start_timeout_s))
        except BaseException:  # the soak never gets this object to stop: stop the broker here
            with signals_ignored():
                self.stop()
            raise
        self.ready.set()
        threading.Thread(target=self._follow, args=(str(self.broker.log_file), self._log_line), daemon=True).start()
        threading.Thread(target=self._follow, args=(self.gc_log, self._gc_line), daemon=True).start()

    async def _until_coordinating(self, group_ids: list[str], timeout_s: float) -> None:
        """Until the broker coordinates every group: the first FindCoordinator creates __consumer_offsets, whose
        partitions then load (a client would rediscover its coordinator meanwhile; the generator does not)."""
        from protocol.apis import ApiKey, request_class
        from protocol.client import KafkaClient
        from protocol.messages import build

        find = request_class(ApiKey.FIND_COORDINATOR, 4)
        deadline = time.monotonic() + timeout_s
        client = await KafkaClient.connect("127.0.0.1", self.broker.port, client_id="soak", timeout_ms=30_000)
        try:
            waiting = group_ids
            while waiting:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Kafka does not coordinate {len(waiting)} groups after {timeout_s:.0f} s")
                answers = []
                for first in range(0, len(waiting), 1_000):
                    found = await client.request(build(find, key_type=0,
                                                       coordinator_keys=tuple(waiting[first:first + 1_000])))
                    answers += found.coordinators
                waiting = [c.key for c in answers if c.error_code]
                if waiting:
                    await asyncio.sleep(0.5)
        finally:
            await client.close()

    def _follow(self, path: str, handle: Callable[[str], None]) -> None:
        while not os.path.exists(path):
            time.sleep(0.2)
        with open(path, errors="replace") as f:
            while self.proc.poll() is None:
                line = f.readline()
                if line:
                    handle(line.rstrip())
                else:
                    time.sleep(0.2)

    def _log_line(self, line: str) -> None:
        self.tail.append(line)
        if "has failed, removing it from the group" in line:
            self.failures += 1
        elif ((" WARN " in line or " ERROR " in line) and len(self.warnings) < 10
              and "Sending empty assignment" not in line):  # our generator's leader assigns nothing: expected
            self.warnings.append(line)

    def _gc_line(self, line: str) -> None:
        found = self.GC_PAUSE.search(line)
        if found is not None:
            self.gc_pauses += 1
            self.window_gc_max_ms = max(self.window_gc_max_ms, float(found.group(1)))
            self.health = {"gc_pauses": float(self.gc_pauses)}

    def take_window(self) -> tuple[float, float, float]:
        values = 0.0, 0.0, self.window_gc_max_ms
        self.window_gc_max_ms = 0.0
        return values

    def stop(self) -> None:
        self.broker.stop_blocking()  # SIGTERM, SIGKILL after its stop timeout
        shutil.rmtree(self.data_dir, ignore_errors=True)


def process_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def process_cpu_s(pid: int) -> float:
    """User + system CPU of every thread of `pid` (a JVM's collector and network threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def somaxconn() -> int:
    """The kernel's cap on every listen backlog (Linux; 4,096 since 5.4)."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 4096


def listen_counters() -> dict[str, int]:
    """TcpExt ListenOverflows/ListenDrops of this network namespace."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], map(int, values.split()[1:])))
            return {"ListenOverflows": table.get("ListenOverflows", 0), "ListenDrops": table.get("ListenDrops", 0)}
    return {"ListenOverflows": 0, "ListenDrops": 0}


# ---------------------------------------------------------------------------------------------- orchestration


class WorkerProcess:
    def __init__(self, spec: dict, event_loop: str) -> None:
        self.proc = spawn([sys.executable, "-m", "bench.soak", "--event-loop", event_loop, "--worker", json.dumps(spec)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.messages: collections.deque[dict] = collections.deque()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.messages.append(json.loads(line))

    def tell(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def take(self, kind: str, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:  # looked at once even with no time left
            for message in list(self.messages):
                if kind in message:
                    self.messages.remove(message)
                    return message[kind]
            if self.proc.poll() is not None:
                raise RuntimeError(f"generator worker exited with {self.proc.returncode}")
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        raise TimeoutError(f"no {kind!r} from a generator worker within {timeout_s:.0f} s")

    def drain(self, kind: str) -> list[dict]:
        """Every message of `kind` received so far, oldest first, removed."""
        found = [m for m in list(self.messages) if kind in m]
        for m in found:
            self.messages.remove(m)
        return [m[kind] for m in found]

    def windows(self) -> list[dict]:
        found = [m["window"] for m in list(self.messages) if "window" in m]
        for m in [m for m in list(self.messages) if "window" in m]:
            self.messages.remove(m)
        return found

    def stop(self) -> None:
        stop_process(self.proc, 0)  # it has sent its figures, or the soak is aborting: nothing to wait for


def wait_formed(workers: list[WorkerProcess], timeout_s: float, every_s: float = 10.0) -> list[dict]:
    """Every worker's forming figures; meanwhile a progress line every `every_s` (forming 300k members takes
    minutes)."""
    started = time.monotonic()
    deadline = started + timeout_s
    latest: dict[int, dict] = {}
    formed: dict[int, dict] = {}
    next_line = started + every_s
    while len(formed) < len(workers):
        for index, worker in enumerate(workers):
            for figures in worker.drain("forming_progress"):
                latest[index] = figures
            if index not in formed:
                with contextlib.suppress(TimeoutError):
                    formed[index] = worker.take("formed", 0.0)
        now = time.monotonic()
        if now >= deadline:
            raise TimeoutError(f"the members were not formed within {timeout_s:.0f} s")
        if now >= next_line and len(formed) < len(workers):
            done = sum(f["members"] for f in latest.values())
            failed = sum(f["failed"] for f in latest.values())
            total = sum(f["of"] for f in latest.values()) or 1
            print(f"  forming: {done} members synced of {total} ({100 * done / total:.0f}%), {failed} failed, "
                  f"{done / (now - started):.0f}/s, {now - started:.0f} s", flush=True)
            next_line = now + every_s
        time.sleep(0.2)
    return [formed[index] for index in range(len(workers))]


def run(args: argparse.Namespace) -> dict:
    limit = raise_fd_limit()
    heartbeat_connections = -(-args.members // args.members_per_connection)
    rejoining = args.workers * Worker.rejoin_window
    if heartbeat_connections + args.form_wave + rejoining + 100 > limit:
        raise SystemExit(f"the server would need {heartbeat_connections} heartbeat connections + {args.form_wave} "
                         f"forming ones + up to {rejoining} of rejoining members, above the open-file limit of "
                         f"{limit}: raise --members-per-connection or lower --form-wave (or ulimit -n)")
    server: ServerProcess | KafkaServer | None = None
    workers: list[WorkerProcess] = []
    try:
        server = KafkaServer(args) if args.server == "kafka" else ServerProcess(args)
        if not server.ready.wait(args.start_timeout_s):
            raise RuntimeError("server not ready: " + " | ".join(server.tail))
        print(f"server pid {server.proc.pid} on port {server.port} ({args.server}); forming {args.members} members "
              f"in {args.members // args.group_size} groups of {args.group_size}", flush=True)
        groups = [f"soak-{i}" for i in range(args.members // args.group_size)]
        before = listen_counters()
        rss_idle = server.rss_mib()
        form_wave = max(1, args.form_wave // args.workers)
        connect_window = args.connect_window if args.connect_window is not None else somaxconn() // 2
        print(f"forming waves of {args.form_wave} members, at most {connect_window or 'any number of'} connections "
              f"waiting to be accepted (somaxconn {somaxconn()})", flush=True)
        for index in range(args.workers):
            workers.append(WorkerProcess({
                "host": "127.0.0.1", "port": server.port, "groups": [index, args.workers, len(groups)],
                "group_size": args.group_size, "interval_s": args.interval_s, "session_ms": args.session_ms,
                "members_per_connection": args.members_per_connection, "form_wave": form_wave,
                "connect_window": connect_window and max(1, connect_window // args.workers)}, args.event_loop))
        formed = wait_formed(workers, args.form_timeout_s)
        after = listen_counters()
        forming = {
            "members": sum(f["members"] for f in formed), "failed": sum(f["failed"] for f in formed),
            "rejoins": sum(f["rejoins"] for f in formed), "seconds": max(f["seconds"] for f in formed),
            "join_spread_s_max": max(f["join_spread_s_max"] for f in formed),
            "connect_s_max": max(f["connect_s_max"] for f in formed),
            "listen_overflows": after["ListenOverflows"] - before["ListenOverflows"],
            "listen_drops": after["ListenDrops"] - before["ListenDrops"],
            "first_error": next((f["first_error"] for f in formed if "first_error" in f), None),
            "server_lag_max_ms": server.take_window()[0],
        }
        print(f"formed {forming['members']} members in {forming['seconds']} s (failed {forming['failed']}, "
              f"rejoins {forming['rejoins']}, join spread max {forming['join_spread_s_max']} s, "
              f"listen overflows {forming['listen_overflows']}, drops {forming['listen_drops']}, "
              f"first error {forming['first_error']}); server warnings: {server.warnings[:3]}; "
              f"warming up {args.warmup_s:.0f} s", flush=True)
        time.sleep(args.warmup_s)
        failures_before = server.failures
        for w in workers:
            w.windows()
            w.tell("measure")
        server.take_window()
        server.measuring = True
        health_start = dict(server.health)
        measure = measure_loop(args, server, workers)
        server.measuring = False  # the generator's teardown and the server's stop are not steady state
        health_end = dict(server.health)
        for w in workers:
            w.tell("stop")
        finals = [w.take("final", 60) for w in workers]
    finally:
        with signals_ignored():
            for w in workers:
                w.stop()
            if server is not None:
                server.stop()
    hist = Histogram()
    errors: collections.Counter = collections.Counter()
    rejoins: collections.Counter = collections.Counter()
    for f in finals:
        hist.merge(f["hist"], f["total"], f["max_us"])
        errors.update(f["errors"])
        rejoins.update(f["rejoins"])
    rss = measure["rss"]
    result = {
        "members": args.members, "groups": len(groups), "interval_s": args.interval_s,
        "session_ms": args.session_ms, "duration_s": args.duration_s, "server": args.server,
        "gc_freeze_every": args.gc_freeze_every, "workers": args.workers, "event_loop": args.event_loop,
        "members_per_connection": args.members_per_connection,
        "forming": forming,
        "answers": hist.total, "heartbeats_per_s": round(hist.total / measure["seconds"]),
        "p50_ms": hist.percentile_ms(0.50), "p99_ms": hist.percentile_ms(0.99),
        "p999_ms": hist.percentile_ms(0.999), "max_ms": hist.max_us / 1000,
        "heartbeat_errors": dict(errors), "false_expirations": server.failures - failures_before,
        # members that rejoined after a heartbeat answer (by its error code), as a consumer does; still rejoining
        # at the end: members missing from the measured load
        "rejoins": {"by_error": dict(rejoins), "while_measuring": sum(f["rejoins_measured"] for f in finals),
                    "failed_attempts": sum(f["rejoin_failures"] for f in finals),
                    "rejoining_at_end": sum(f["rejoining"] for f in finals),
                    "first_error": next((f["rejoin_first_error"] for f in finals if f["rejoin_first_error"]), None)},
        "members_heartbeating": sum(f["active"] for f in finals) - sum(f["rejoining"] for f in finals),
        "false_expirations_total": server.failures,  # forming and warm-up included
        # Kafka has no event loop to probe
        "server_loop_lag_max_ms": None if args.server == "kafka" else measure["lag_max_ms"],
        "server_loop_busy_max_ms": None if args.server == "kafka" else measure["busy_max_ms"],
        "server_gc_pause_max_ms": measure["gc_max_ms"],
        # --time-callbacks: the callbacks that were the longest of a 5-s window, by their longest (ms CPU)
        "server_longest_callbacks": dict(sorted(getattr(server, "callbacks", {}).items(),
                                                key=lambda item: -item[1])[:8]),
        "server_collections": {f"gc{g}": int(health_end.get(f"gc{g}_collections", 0)
                                             - health_start.get(f"gc{g}_collections", 0)) for g in range(3)},
        # objects the collector policy froze while measuring: state that became long-lived in steady state
        "server_frozen_while_measuring": int(health_end.get("gc_frozen_total", 0)
                                             - health_start.get("gc_frozen_total", 0)),
        "server_health": server.health,
        "server_cpu_us_per_heartbeat": round(measure["server_cpu_s"] * 1e6 / max(hist.total, 1), 1),
        "server_cpu_pct": round(100 * measure["server_cpu_s"] / measure["seconds"], 1),
        "generator_cpu_pct_max": measure["generator_cpu_pct_max"],
        "generator_schedule_late_max_ms": measure["schedule_late_max_ms"],
        "rss_mib": {"idle": round(rss_idle), "start": rss[0], "middle": rss[len(rss) // 2], "end": rss[-1],
                    "max": max(rss)},
        "stall_lines": server.stall_lines[:5],
        "server_warnings": server.warnings,
        "load_average": os.getloadavg(),
    }
    return result


def measure_loop(args: argparse.Namespace, server: ServerProcess | KafkaServer,
                 workers: list[WorkerProcess]) -> dict:
    started = time.monotonic()
    cpu_start = server.cpu_s()
    rss = [round(server.rss_mib())]
    lag_max = busy_max = gc_max = gen_cpu_max = late_max = 0.0
    while (elapsed := time.monotonic() - started) < args.duration_s:
        try:
            time.sleep(min(REPORT_S, args.duration_s - elapsed))
        except KeyboardInterrupt:  # Ctrl-C ends the measurement early, with a summary of what was measured
            print("interrupted: summarising what was measured", flush=True)
            break
        lag, busy, gc_ms = server.take_window()
        lag_max, busy_max, gc_max = max(lag_max, lag), max(busy_max, busy), max(gc_max, gc_ms)
        rss.append(round(server.rss_mib()))
        windows = [win for w in workers for win in w.windows()]
        count = sum(win["count"] for win in windows)
        gen_cpu = max((win["cpu_pct"] for win in windows), default=0.0)
        late = max((win["schedule_late_max_ms"] for win in windows), default=0.0)
        rejoined, rejoining = sum(win["rejoins"] for win in windows), sum(win["rejoining"] for win in windows)
        gen_cpu_max, late_max = max(gen_cpu_max, gen_cpu), max(late_max, late)
        print(f"{time.monotonic() - started:6.0f} s  answers {count:7d}  max "
              f"{max((win['max_us'] for win in windows), default=0) / 1000:7.1f} ms  >20ms "
              f"{sum(win['slow'] for win in windows):5d}  server lag max {lag:6.1f} ms (busy {busy:5.1f})  gc max {gc_ms:6.1f} ms  "
              f"rss {rss[-1]} MiB  generator cpu {gen_cpu:.0f}%  late {late:.0f} ms  expirations {server.failures}  "
              f"rejoins {rejoined} (rejoining {rejoining})", flush=True)
        if server.proc.poll() is not None:
            raise RuntimeError("server exited: " + " | ".join(server.tail))
    return {"seconds": time.monotonic() - started, "server_cpu_s": server.cpu_s() - cpu_start, "rss": rss,
            "lag_max_ms": lag_max, "busy_max_ms": busy_max, "gc_max_ms": gc_max, "generator_cpu_pct_max": gen_cpu_max,
            "schedule_late_max_ms": late_max}


def _run(coro, event_loop: str, *, server: bool = False) -> None:
    """`server`: on asyncio, the service's loop (a bounded number of ready connections a turn, as `coordinator
    serve` runs it: coordinator/server/event_loop.py); the generator's workers keep asyncio's own."""
    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                raise SystemExit("uvloop is not installed")
        else:
            uvloop.run(coro)
            return
    if server:
        from coordinator.server.event_loop import run as service_run

        service_run(coro)
        return
    asyncio.run(coro)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=20_000)
    parser.add_argument("--group-size", type=int, default=10)
    parser.add_argument("--interval-s", type=float, default=10.0, help="heartbeat interval of every member")
    parser.add_argument("--session-ms", type=int, default=30_000)
    parser.add_argument("--duration-s", type=float, default=60.0, help="measured time after forming + warm-up")
    parser.add_argument("--warmup-s", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2, help="generator processes")
    parser.add_argument("--members-per-connection", type=int, default=10,
                        help="heartbeat connections are shared (forming uses one connection per member)")
    parser.add_argument("--form-wave", type=int, default=10_000,
                        help="members connecting and joining at once (all workers together)")
    parser.add_argument("--connect-window", type=int, default=None,
                        help="forming connections opened and not yet answered, all workers together (default: half "
                             "of somaxconn, so the server's listen queue never overflows; 0 = a whole wave at once)")
    parser.add_argument("--server", choices=["memory", "service", "serve", "kafka"], default="memory",
                        help="memory: our runtime alone, in-memory store; service: `coordinator serve --no-relay` "
                             "(our Kafka-backed store); serve: `coordinator serve` as deployed (relay on); kafka: "
                             "Kafka's own group coordinator (the embedded broker), the anchor for ratios")
    parser.add_argument("--kafka-heap-mb", type=int, default=2048, help="kafka: the broker's -Xmx")
    parser.add_argument("--bootstrap-server", default=None, help="service: Kafka to use (default: embedded)")
    parser.add_argument("--initial-delay-ms", type=int, default=3_000, help="group.initial.rebalance.delay.ms")
    parser.add_argument("--listen-backlog", type=int, default=None, help="server's listen backlog (default: its own)")
    parser.add_argument("--gc-freeze-every", type=int, default=1,
                        help="server's GC policy (COORDINATOR_GC_FREEZE_EVERY; 0 = interpreter default)")
    parser.add_argument("--event-loop", choices=["auto", "asyncio", "uvloop"], default="auto",
                        help="server and generator loop; auto: uvloop when installed, as `coordinator serve` does")
    parser.add_argument("--time-callbacks", action="store_true",
                        help="server times every loop callback in CPU time and names the longest of each window "
                             "(COORDINATOR_TIME_CALLBACKS; asyncio's loop only, so with --event-loop asyncio)")
    parser.add_argument("--server-log", metavar="PATH",
                        help="our server's log, every line, kept in PATH (its stops and slow callbacks included)")
    parser.add_argument("--start-timeout-s", type=float, default=180.0)
    parser.add_argument("--form-timeout-s", type=float, default=900.0)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--serve-memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _run(run_worker(json.loads(args.worker)), args.event_loop)
        return 0
    if args.serve_memory:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s %(message)s")
        for handler in logging.getLogger().handlers:  # forming logs ~5 lines per member: keep what we read
            handler.addFilter(lambda r: r.name != "coordinator.group" or r.levelno > logging.INFO
                              or "has failed" in r.msg)
        _run(serve_memory(args.initial_delay_ms, args.listen_backlog), args.event_loop, server=True)
        return 0
    if args.members % args.group_size:
        parser.error("--members must be a multiple of --group-size")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_terminated)
    try:
        result = run(args)
    except Terminated as stopped:
        print(f"soak {stopped}: every process it started is stopped", file=sys.stderr, flush=True)
        return 128 + stopped.signum
    except KeyboardInterrupt:  # while forming or warming up (while measuring, Ctrl-C ends with a summary)
        print("soak interrupted: every process it started is stopped", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    f = result["forming"]
    print(f"\n{result['members']} members, {result['heartbeats_per_s']} heartbeats/s for {args.duration_s:.0f} s "
          f"({args.server} server, gc freeze every {args.gc_freeze_every}):\n"
          f"  answers p50 {result['p50_ms']} ms  p99 {result['p99_ms']} ms  p99.9 {result['p999_ms']} ms  "
          f"max {result['max_ms']} ms\n"
          f"  server loop lag max {result['server_loop_lag_max_ms']} ms (longest busy stretch "
          f"{result['server_loop_busy_max_ms']} ms CPU), gc pause max "
          f"{result['server_gc_pause_max_ms']} ms, collections {result['server_collections']}, objects frozen "
          f"{result['server_frozen_while_measuring']}; cpu {result['server_cpu_pct']}% "
          f"({result['server_cpu_us_per_heartbeat']} µs/heartbeat)\n"
          f"  longest loop callbacks (ms CPU): {result['server_longest_callbacks'] or 'not timed'}\n"
          f"  rss MiB {result['rss_mib']}\n"
          f"  false expirations {result['false_expirations']} (since start {result['false_expirations_total']}), "
          f"heartbeat errors {result['heartbeat_errors']}\n"
          f"  rejoins after heartbeat errors {result['rejoins']}, members heartbeating at the end "
          f"{result['members_heartbeating']}\n"
          f"  forming: {f['members']} in {f['seconds']} s, failed {f['failed']}, rejoins {f['rejoins']}, "
          f"listen overflows {f['listen_overflows']}\n"
          f"  generator: cpu max {result['generator_cpu_pct_max']}% per process, schedule late max "
          f"{result['generator_schedule_late_max_ms']} ms; load average {result['load_average']}", flush=True)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
