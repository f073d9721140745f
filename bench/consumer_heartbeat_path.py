"""ConsumerGroupHeartbeat's request path in process, without sockets: the server's CPU per steady heartbeat from
the frame to the answer, away from the kernel and the load generator (what bench.consumer_protocol measures
around them, on a shared machine).

  python -m bench.consumer_heartbeat_path [--groups 1000] [--heartbeats 50000] [--topics cluster|static]
                                          [--connections 100] [--classic] [--relay]
                                          [--compare | --compare-steady-frame [--rounds 10]]
                                          [--profile FILE]

`groups` × 10 members join one 10-partition topic and reconcile through GroupRuntime (in-memory store, heartbeat
interval 250 ms as the race's); then steady heartbeat frames (member id and epoch, every other field null), made
by bench.consumer_protocol's request builder, go through `Connection.buffer_updated` of `connections` connections
with a transport that only counts the answers, the loop turning every `connections` frames (and until the turn
budget's deferred frames are handled). `--relay`: each connection with the relay's side, as `coordinator serve`
runs them (its default; the route table is the served ranges, nothing goes upstream).
`--classic`: classic groups of 10 and their Heartbeat v4 frames instead (the
connection's fast path, the turn budget's unit: server/turns.py charges the steady ConsumerGroupHeartbeat the ratio). `cluster`: the topics are the relay's
view (ClusterMetadata) whose refresh takes 3 ms, as a Metadata round trip to the cluster; `static`: a fixed set.
Prints the main thread's CPU time per heartbeat (thread time, the loop's turns included) and the answers
counted; `--compare` alternates windows with and without the group logic's steady-state shortcut (medians of
each and their ratio); `--profile` writes cProfile's statistics (thread CPU time) of the measured part."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import random
import statistics
import time
from collections.abc import Awaitable, Callable
import uuid
from types import SimpleNamespace
from typing import Any

from bench.consumer_protocol import heartbeat_request
from bench.wire import _stable_group, heartbeat_frame
from coordinator.config import CoordinatorConfig
from coordinator.group.modern.heartbeat import HeartbeatRequest
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.relay.cluster import ClusterMetadata
from coordinator.relay.config import RelayConfig
from coordinator.relay.relay import Relay
from coordinator.relay.versions import advertised_ranges
from coordinator.server.config import ServerConfig
from coordinator.server.connection import Connection
from coordinator.server.context import Node
from coordinator.server.handlers import served_ranges
from coordinator.server.turns import turn_budget
from coordinator.timer import SystemTimer
from coordinator.topics import StaticTopics, TopicImage
from protocol import codec

TOPIC, TOPIC_ID, PARTITIONS, GROUP_SIZE = "t", uuid.UUID(int=0x7), 10, 10
INTERVAL_MS = 250


class CountingTransport:
    """What a connection writes to: counted, dropped."""

    def __init__(self) -> None:
        self.answers = 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name in ("peername", "sockname") else default

    def write(self, data: bytes) -> None:
        self.answers += 1

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None: ...

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...


def _metadata() -> SimpleNamespace:
    return SimpleNamespace(topics=[SimpleNamespace(name=TOPIC, error_code=0, partitions=list(range(PARTITIONS)),
                                                   topic_id=TOPIC_ID)])


def _runtime(topics: str, timer: SystemTimer) -> GroupRuntime:
    config = CoordinatorConfig(group_consumer_heartbeat_interval_ms=INTERVAL_MS,
                               group_consumer_min_heartbeat_interval_ms=INTERVAL_MS,
                               group_initial_rebalance_delay_ms=200)  # --classic: groups form at once
    runtime = GroupRuntime(config, timer, InMemoryGroupStore())
    if topics == "static":
        runtime.consumer_groups.topics = StaticTopics([TopicImage(TOPIC_ID, TOPIC, PARTITIONS)])
        return runtime

    async def refresh(_names: list[str]) -> SimpleNamespace:
        await asyncio.sleep(0.003)
        return _metadata()

    cluster = ClusterMetadata(refresh, 100)
    cluster.observe(_metadata(), all_topics=False)
    runtime.consumer_groups.topics = cluster
    runtime.refresh_topics = lambda names: cluster.refresh(names, INTERVAL_MS)
    runtime.stale_topics = lambda names: cluster.stale(names, INTERVAL_MS)
    return runtime


async def _form(runtime: GroupRuntime, group_id: str) -> list[tuple[str, str, int]]:
    """A Stable group: members join, then acknowledge what they were given until nothing changes."""
    members: dict[str, tuple[int, dict[uuid.UUID, tuple[int, ...]] | None]] = {
        str(uuid.uuid4()): (0, None) for _ in range(GROUP_SIZE)}
    for _ in range(30):
        changed = False
        for member_id, (epoch, owned) in members.items():
            joining = epoch == 0
            request = HeartbeatRequest(group_id, member_id, epoch, rebalance_timeout_ms=60_000 if joining else -1,
                                       subscribed_topic_names=(TOPIC,) if joining else None,
                                       owned=[] if joining else (None if owned is None else list(owned.items())),
                                       client_id="bench", client_host="/127.0.0.1")
            response = await runtime.consumer_group_heartbeat(request)
            if response.error:
                raise RuntimeError(f"{group_id}: error {response.error} {response.message}")
            if response.assignment is not None and response.assignment != owned:
                owned, changed = dict(response.assignment), True
            changed = changed or response.member_epoch != epoch
            members[member_id] = (response.member_epoch, owned)
        if not changed:
            break
    return [(group_id, member_id, epoch) for member_id, (epoch, _owned) in members.items()]


def _local_relay() -> Relay:
    """A relay as `coordinator serve` has one (its connections get a RelaySide), its route table the served
    ranges: the group APIs are answered here, so no upstream broker is needed (nothing is ever relayed)."""
    relay = Relay(RelayConfig(), "127.0.0.1:9", served=served_ranges(), max_frame_bytes=ServerConfig().max_frame_bytes)
    relay.advertised = advertised_ranges({}, relay.served)
    return relay


async def main(args: argparse.Namespace) -> dict[str, Any]:
    timer = SystemTimer("bench")
    timer.start()
    runtime = _runtime(args.topics, timer)
    try:
        if args.classic:  # Heartbeat v4 of classic groups' members: the turn budget's unit
            classic = await asyncio.gather(*(_stable_group(runtime, f"c{g}", GROUP_SIZE) for g in range(args.groups)))
            classic_members = [m for group in classic for m in group]
            frames = [heartbeat_frame(g, generation, m) for g, generation, m in classic_members]
        else:
            members = [m for g in range(args.groups) for m in await _form(runtime, f"g{g}")]
            frames = [codec.encode_request(0, "bench", heartbeat_request(g, m, e)) for g, m, e in members]
        random.shuffle(frames)
        host = SimpleNamespace(config=ServerConfig(), relay=_local_relay() if args.relay else None, directory=None,
                               coordinator=runtime,
                               clock=runtime.clock, node=Node(0, "127.0.0.1", 9092, "bench"), closing=False,
                               authorizer=None, admit=lambda _c: True, forget=lambda _c: None,
                               parked=lambda _c: None, unparked=lambda _c: None)
        connections_count = args.connections
        transports = [CountingTransport() for _ in range(connections_count)]
        connections = []
        for transport in transports:
            connection = Connection(host)
            connection.connection_made(transport)  # type: ignore[arg-type]
            connections.append(connection)

        budget = turn_budget()

        async def drive(count: int, start: int) -> None:
            for k in range(count):
                frame, connection = frames[(start + k) % len(frames)], connections[k % connections_count]
                connection.get_buffer(-1)[:len(frame)] = frame
                connection.buffer_updated(len(frame))
                if k % connections_count == connections_count - 1:
                    await asyncio.sleep(0)  # the loop turns: parked requests carry on
                    while budget.waiting:  # frames left over for later turns (the requests-per-turn budget)
                        await asyncio.sleep(0)

        await drive(2 * len(frames), 0)  # warm-up: every member heartbeats twice
        if args.compare:
            return await _compared(runtime, drive, args)
        if args.compare_steady_frame:
            return await _compared_steady_frame(drive, args)
        answered_before = sum(t.answers for t in transports)
        profiler = cProfile.Profile(time.thread_time) if args.profile else None
        started = time.thread_time()
        if profiler is not None:
            profiler.enable()
        await drive(args.heartbeats, 0)
        await asyncio.sleep(0.05)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        cpu_s = time.thread_time() - started
        answered = sum(t.answers for t in transports) - answered_before
        figures = {"requests": "Heartbeat v4" if args.classic else "ConsumerGroupHeartbeat",
                   "relay": args.relay,
                   "connections": args.connections, "topics": args.topics, "members": len(frames), "heartbeats": args.heartbeats,
                   "answered": answered, "cpu_us_per_heartbeat": round(cpu_s / args.heartbeats * 1e6, 1)}
        print(f"{args.topics}: {figures['cpu_us_per_heartbeat']} µs of main-thread CPU per heartbeat, "
              f"{answered} of {args.heartbeats} answered in the window")
        return figures
    finally:
        await runtime.shutdown()
        await timer.close()


async def _compared(runtime: GroupRuntime, drive: Callable[[int, int], Awaitable[None]], args: argparse.Namespace
                    ) -> dict[str, Any]:
    """CPU per heartbeat with the group logic's steady-state shortcut and without it (every heartbeat through the
    full path), in alternating windows of the same process: a loaded machine's drift hits both alike."""
    service = runtime.consumer_groups
    window = max(args.heartbeats // args.rounds, 1)
    cpu_us: dict[str, list[float]] = {"shortcut": [], "full": []}
    for round_ in range(args.rounds):
        for name in (("shortcut", "full") if round_ % 2 == 0 else ("full", "shortcut")):
            service.steady_shortcut = name == "shortcut"
            started = time.thread_time()
            await drive(window, round_ * window)
            cpu_us[name].append((time.thread_time() - started) / window * 1e6)
    service.steady_shortcut = True
    medians = {name: round(statistics.median(values), 1) for name, values in cpu_us.items()}
    figures = {"topics": args.topics, "heartbeats_per_window": window, "rounds": args.rounds,
               "cpu_us_per_heartbeat_shortcut": medians["shortcut"], "cpu_us_per_heartbeat_full": medians["full"],
               "shortcut_over_full": round(medians["shortcut"] / medians["full"], 3),
               "windows_us": {name: [round(v, 1) for v in values] for name, values in cpu_us.items()}}
    print(f"{args.topics}: {medians['shortcut']} µs per heartbeat with the steady-state shortcut, {medians['full']} "
          f"µs through the full path (medians of {args.rounds} alternating windows of {window})")
    return figures


async def _compared_steady_frame(drive: Callable[[int, int], Awaitable[None]], args: argparse.Namespace
                                 ) -> dict[str, Any]:
    """CPU per heartbeat with the steady heartbeat answered from its frame (the connection's steady path) and
    without it (the hand reader, the handler's start and the runtime's), alternating windows as `_compared`."""
    steady_path = Connection._steady_consumer_group_heartbeat
    window = max(args.heartbeats // args.rounds, 1)
    cpu_us: dict[str, list[float]] = {"steady_frame": [], "general": []}
    try:
        for round_ in range(args.rounds):
            for name in (("steady_frame", "general") if round_ % 2 == 0 else ("general", "steady_frame")):
                chosen: Callable[[Connection, bytes], bool] = (
                    steady_path if name == "steady_frame" else lambda _self, _frame: False)
                setattr(Connection, "_steady_consumer_group_heartbeat", chosen)
                started = time.thread_time()
                await drive(window, round_ * window)
                cpu_us[name].append((time.thread_time() - started) / window * 1e6)
    finally:
        setattr(Connection, "_steady_consumer_group_heartbeat", steady_path)
    medians = {name: round(statistics.median(values), 1) for name, values in cpu_us.items()}
    figures = {"topics": args.topics, "heartbeats_per_window": window, "rounds": args.rounds,
               "cpu_us_per_heartbeat_steady_frame": medians["steady_frame"],
               "cpu_us_per_heartbeat_general": medians["general"],
               "steady_frame_over_general": round(medians["steady_frame"] / medians["general"], 3)}
    print(f"{args.topics}: {medians['steady_frame']} µs per heartbeat answered from its frame, {medians['general']} "
          f"µs through the general path (medians of {args.rounds} alternating windows of {window})")
    return figures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--heartbeats", type=int, default=50_000)
    parser.add_argument("--connections", type=int, default=100,
                        help="connections the frames go through, one frame each per loop turn")
    parser.add_argument("--topics", choices=["cluster", "static"], default="cluster")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    parser.add_argument("--compare", action="store_true",
                        help="alternate windows with and without the group logic's steady-state shortcut")
    parser.add_argument("--compare-steady-frame", action="store_true",
                        help="alternate windows with and without the connection's steady path (answered from the "
                        "frame)")
    parser.add_argument("--classic", action="store_true",
                        help="classic groups' Heartbeat v4 instead (the connection's fast path: the turn budget's unit)")
    parser.add_argument("--relay", action="store_true",
                        help="connections with the relay's side, as `coordinator serve` runs them (its default)")
    parser.add_argument("--rounds", type=int, default=10, help="--compare*: windows of each kind")
    parser.add_argument("--profile", help="cProfile statistics of the measured heartbeats (pstats file)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    from bench import run_and_print

    arguments = parse_args()
    run_and_print(main(arguments), arguments.loop)
