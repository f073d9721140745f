"""A classic rebalance's request path in process, without sockets: the event loop's CPU per rebalance of a Stable
group, join phase and sync phase apart, away from the kernel, the load generator and the broker (what
bench.coordinator measures around them on a shared machine).

  python -m bench.rebalance_path [--members 1000] [--rounds 10] [--warmup 2] [--profile FILE]

A group of `members` forms through GroupRuntime (a store that encodes each record with the state topic's codec,
as the Kafka store does on the loop, and acknowledges it in the next loop turn); then each round every member sends
a JoinGroup v9 with new metadata (as bench.coordinator's rounds) through `Connection.buffer_updated` of its own
connection (a transport that keeps the answers), and once every JoinGroup is answered, a SyncGroup v5 (the
leader's first, carrying one byte for every member); `--as-served`: the connections' host as the race's `serve`
has it (the listener's bookkeeping, the relay without a link, the cluster's authorizer not enforcing). The loop turns between the frames of each batch of 64 (the
turn budget's share of other requests) and until every answer is written. Prints the main thread's CPU time of
each phase (thread time: the loop's turns included, medians over the rounds); `--profile` writes cProfile's
statistics (thread CPU time) of the measured rounds. `compiled_modules` counts the project's modules loaded from
an extension module: 0 for a pure tree. COORDINATOR_COMPILED=DIR (or 1: this tree's build/compiled,
scripts/build_compiled.py) runs the listed modules from that build, as `coordinator serve` runs them by default
(each only while its sources match: `compiled_modules` says how many did).

  COORDINATOR_COMPILED=1 taskset -c 1 python -m bench.rebalance_path --as-served --rounds 40"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import os
import statistics
import struct
import sys
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from coordinator import compiled

# installed before any listed module is imported here (coordinator/compiled.py decides once)
_COMPILED = compiled.directory_asked(os.environ.get(compiled.ENVIRONMENT))
_DECISION = None if _COMPILED is None else compiled.install(_COMPILED)

from coordinator.config import CoordinatorConfig  # noqa: E402
from coordinator.group.observer import ObserverMux  # noqa: E402
from coordinator.group.records import Record  # noqa: E402
from coordinator.group.runtime import GroupRuntime  # noqa: E402
from coordinator.group.state import STABLE  # noqa: E402
from coordinator.group.store import InMemoryGroupStore  # noqa: E402
from coordinator.runtime_health import YOUNG_THRESHOLD, RuntimeHealth  # noqa: E402
from coordinator.relay.config import RelayConfig  # noqa: E402
from coordinator.relay.relay import Relay  # noqa: E402
from coordinator.security.authorizer import Authorizer  # noqa: E402
from coordinator.server.config import ServerConfig  # noqa: E402
from coordinator.server.connection import Connection  # noqa: E402
from coordinator.server.context import Node  # noqa: E402
from coordinator.server.handlers import served_ranges  # noqa: E402
from coordinator.server.listener import CoordinatorServer  # noqa: E402
from coordinator.server.turns import turn_budget  # noqa: E402
from coordinator.storage.records import encode  # noqa: E402
from coordinator.timer import SystemTimer  # noqa: E402
from protocol.consumer_protocol import Subscription, encode_subscription  # noqa: E402
from protocol.fastpath import _compact_string, _legacy_string, unsigned_varint  # noqa: E402
from protocol.group_fastpath import pack_sync_group_request  # noqa: E402

GROUP = "rb"
SESSION_MS, REBALANCE_MS = 30_000, 60_000
BATCH = 64  # frames handed to the connections between two loop turns


class CapturingTransport:
    """What a connection writes to: the answers kept (one write may hold several), counted for all."""

    written = 0  # writes to every transport

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name in ("peername", "sockname") else default

    def write(self, data: bytes) -> None:
        self.frames.append(bytes(data))
        CapturingTransport.written += 1

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...


class EncodingStore(InMemoryGroupStore):
    """Encodes each record as the Kafka store does (on the loop) and acknowledges in the next turn; keeps nothing."""

    def append(self, partition: int, records: Sequence[Record]) -> asyncio.Future[None]:
        for record in records:
            encode(record)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(done.set_result, None)
        return done


def join_frame(correlation_id: int, member_id: str, metadata: bytes) -> bytes:
    """A JoinGroup v9 request frame (flexible: header v2), as librdkafka and bench.coordinator send it."""
    body = b"".join([
        struct.pack(">hhi", 11, 9, correlation_id), _legacy_string("bench"), b"\x00",
        _compact_string(GROUP), struct.pack(">ii", SESSION_MS, REBALANCE_MS), _compact_string(member_id),
        _compact_string(None), _compact_string("consumer"), unsigned_varint(2), _compact_string("range"),
        unsigned_varint(len(metadata) + 1), metadata, b"\x00", _compact_string(None), b"\x00"])
    return struct.pack(">i", len(body)) + body


def _error_code(frame: bytes) -> int:
    # size, correlation id, the flexible header's tags, throttle time: then the error code (JoinGroup v9, SyncGroup v5)
    return struct.unpack_from(">h", frame, 13)[0]


def served_host(runtime: GroupRuntime) -> CoordinatorServer:
    """The connections' host as the race's `serve` has it: the listener itself (its parked/unparked
    bookkeeping), the relay (every API it serves advertised at its own range, no link opened: the group APIs
    stay local) and the cluster's authorizer, not enforcing (the embedded broker has none); not started."""
    config = ServerConfig()
    relay = Relay(RelayConfig(), "127.0.0.1:9", served=served_ranges(), max_frame_bytes=config.max_frame_bytes)
    relay.advertised = served_ranges()
    return CoordinatorServer(config, runtime, clock=runtime.clock, relay=relay, authorizer=Authorizer())


class Harness:
    def __init__(self, runtime: GroupRuntime, members: int, as_served: bool = False) -> None:
        host: Any = served_host(runtime) if as_served else SimpleNamespace(
            config=ServerConfig(), relay=None, directory=None, coordinator=runtime, clock=runtime.clock,
            node=Node(0, "127.0.0.1", 9092, "bench"), closing=False, authorizer=None, admit=lambda _c: True,
            forget=lambda _c: None, parked=lambda _c: None, unparked=lambda _c: None)
        self.runtime = runtime
        self.transports = [CapturingTransport() for _ in range(members)]
        self.connections = []
        for transport in self.transports:
            connection = Connection(host)
            connection.connection_made(transport)  # type: ignore[arg-type]
            self.connections.append(connection)
        self.correlation_id = 0
        self.budget = turn_budget()

    async def exchange(self, frames: list[tuple[int, bytes]]) -> list[bytes]:
        """Each (connection index, frame) handed over, BATCH a turn; the answers, once all are written."""
        marks = [len(t.frames) for t in self.transports]
        target = CapturingTransport.written + len(frames)  # one write per answer: one member per connection
        for k, (index, frame) in enumerate(frames):
            connection = self.connections[index]
            view = memoryview(frame)
            while view:  # as the transport hands it over: as much as the connection's buffer takes
                buffer = connection.get_buffer(-1)
                size = min(len(buffer), len(view))
                buffer[:size] = view[:size]
                connection.buffer_updated(size)
                view = view[size:]
            if k % BATCH == BATCH - 1:
                await asyncio.sleep(0)
        for _ in range(1_000_000):  # a counter, not a pass over the transports: the harness's own cost stays out
            if CapturingTransport.written >= target:
                break
            await asyncio.sleep(0)
        else:
            raise RuntimeError("answers missing")
        if any(len(self.transports[i].frames) <= marks[i] for i, _ in frames):
            raise RuntimeError("an answer went to the wrong connection")
        return [self.transports[i].frames[marks[i]] for i, _ in frames]

    def next_id(self) -> int:
        self.correlation_id += 1
        return self.correlation_id

    async def form(self, members: int) -> list[str]:
        metadata = encode_subscription(Subscription(("t0000",)))
        first = await self.exchange([(i, join_frame(self.next_id(), "", metadata)) for i in range(members)])
        member_ids = [_member_id_of(frame) for frame in first]
        await self.rebalance(member_ids, metadata)
        return member_ids

    async def rebalance(self, member_ids: list[str], metadata: bytes) -> tuple[float, float]:
        """One round: (join phase, sync phase) thread CPU in ms."""
        frames = [(i, join_frame(self.next_id(), m, metadata)) for i, m in enumerate(member_ids)]
        started = time.thread_time()
        joined = await self.exchange(frames)
        join_cpu = time.thread_time() - started
        if {_error_code(f) for f in joined} != {0}:
            raise RuntimeError(f"JoinGroup errors {sorted({_error_code(f) for f in joined})}")
        group = self.runtime.groups[GROUP]
        leader = member_ids.index(group.leader_id or "")
        order = [leader] + [i for i in range(len(member_ids)) if i != leader]
        everyone = [(m, b"\x00") for m in member_ids]
        syncs = [(i, pack_sync_group_request(5, self.next_id(), "bench", GROUP, group.generation_id, member_ids[i],
                                             None, "consumer", "range", everyone if i == leader else []))
                 for i in order]
        started = time.thread_time()
        synced = await self.exchange(syncs)
        sync_cpu = time.thread_time() - started
        if {_error_code(f) for f in synced} != {0}:
            raise RuntimeError(f"SyncGroup errors {sorted({_error_code(f) for f in synced})}")
        return join_cpu * 1000, sync_cpu * 1000


def _member_id_of(frame: bytes) -> str:
    """The member id of a JoinGroup v9 answer (MEMBER_ID_REQUIRED's or a joined member's)."""
    offset = 4 + 4 + 1 + 4 + 2 + 4  # size, correlation id, tags, throttle, error, generation
    for _ in range(3):  # protocol type, protocol name, leader
        length = frame[offset] - 1  # short strings: one-byte varints
        offset += 1 + max(length, 0)
    offset += 1  # skip_assignment
    length = frame[offset] - 1
    return frame[offset + 1:offset + 1 + length].decode()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    # the server's collector policy and loop probe, as `serve` runs them (COORDINATOR_GC_YOUNG_THRESHOLD too)
    health = RuntimeHealth(summary_interval_s=0, young_threshold=int(os.environ.get(
        "COORDINATOR_GC_YOUNG_THRESHOLD", str(YOUNG_THRESHOLD))))
    health.start()
    timer = SystemTimer("bench")
    timer.start()
    config = CoordinatorConfig(group_initial_rebalance_delay_ms=100, group_max_size=100_000)
    runtime = GroupRuntime(config, timer, EncodingStore(), observer=ObserverMux())  # as `serve` has it
    try:
        harness = Harness(runtime, args.members, args.as_served)
        member_ids = await harness.form(args.members)
        while not runtime.groups[GROUP].is_in(STABLE):
            await asyncio.sleep(0.01)
        for round_number in range(args.warmup):
            await harness.rebalance(member_ids, encode_subscription(Subscription((f"w{round_number:04d}",))))
        profiler = cProfile.Profile(time.thread_time) if args.profile else None
        joins, syncs = [], []
        gc_before = _gc_figures(health)
        for round_number in range(args.rounds):
            metadata = encode_subscription(Subscription((f"b{round_number:04d}",)))
            if profiler is not None:
                profiler.enable()
            join_ms, sync_ms = await harness.rebalance(member_ids, metadata)
            if profiler is not None:
                profiler.disable()
            joins.append(join_ms)
            syncs.append(sync_ms)
        if profiler is not None:
            profiler.dump_stats(args.profile)
        totals = [j + s for j, s in zip(joins, syncs)]
        gc_after = _gc_figures(health)
        figures = {"members": args.members, "rounds": args.rounds, "as_served": args.as_served,
                   "cpu_ms_per_rebalance": round(statistics.median(totals), 2),
                   "min_cpu_ms_per_rebalance": round(min(totals), 2),
                   "join_phase_cpu_ms": round(statistics.median(joins), 2),
                   "sync_phase_cpu_ms": round(statistics.median(syncs), 2),
                   "us_per_member": round(statistics.median(totals) / args.members * 1000, 1),
                   # the collector's work in the measured rounds (GcMonitor), per rebalance
                   **{name: round((gc_after[name] - gc_before[name]) / args.rounds, 2) for name in gc_after},
                   "gc0_cpu_max_ms": round(health.gc.generations[0].max_cpu_pause_s * 1000, 2),
                   "gc1_cpu_max_ms": round(health.gc.generations[1].max_cpu_pause_s * 1000, 2),
                   "compiled_modules": compiled_modules()}
        print(json.dumps(figures))
        return figures
    finally:
        await runtime.shutdown()
        await timer.close()
        await health.stop()


def compiled_modules() -> int:
    """How many of the project's modules imported here are extension modules (scripts/mypyc_tree.py's build)."""
    return sum(1 for name, module in list(sys.modules.items())
               if name.split(".", 1)[0] in ("coordinator", "protocol")
               and (getattr(module, "__file__", None) or "").endswith(".so"))


def _gc_figures(health: RuntimeHealth) -> dict[str, float]:
    generations = health.gc.generations
    return {"gc0_per_rebalance": generations[0].collections, "gc1_per_rebalance": generations[1].collections,
            "gc2_per_rebalance": generations[2].collections,
            "gc_pause_ms_per_rebalance": health.gc.total_pause_s * 1000}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    parser.add_argument("--profile", help="cProfile statistics of the measured rounds (thread CPU time)")
    parser.add_argument("--as-served", action="store_true",
                        help="the connections' host as the race's serve has it: the listener, the relay (no link "
                             "opened), the cluster's authorizer not enforcing (served_host)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)  # as the race's `serve --log-level WARNING`
    arguments = parse_args()
    if arguments.loop == "uvloop":
        import uvloop
        uvloop.install()
    asyncio.run(main(arguments))
