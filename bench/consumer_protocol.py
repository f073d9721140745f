"""The consumer group protocol (KIP-848) raced against Apache Kafka's own coordinator: the same raw-frame clients,
the same group settings, against (a) `coordinator serve` and (b) the embedded Apache Kafka broker.

  python -m bench.consumer_protocol [--repeats 2] [--seconds 4] [--groups 1000] [--group-size 10]
                                    [--connections 100,1000] [--reconcile-sizes 10,100,1000]
                                    [--figures consumer-heartbeat,reconcile] [--interval-ms 250]
                                    [--profile FILE [--profiler py-spy|cprofile]] [--baseline-tree DIR]
                                    [--serve-arg ARGS] [--baseline-serve-arg ARGS]

Figures, each for both servers, with the ratio ours ÷ Kafka (throughput: higher is better; times and CPU: lower is
better):
- consumer-heartbeat: ConsumerGroupHeartbeat v1 throughput and p50/p99 latency of `groups × group-size` members
  (default 10,000 in 1,000 groups, one 10-partition topic each group subscribes to) already reconciled (Stable),
  over 100 and 1,000 connections, one heartbeat in flight per connection (closed loop), cycling through the
  members; each heartbeat is what a client sends in the steady state (member id and epoch, every other field null:
  unchanged); plus the server's CPU time per heartbeat (all its threads), the robust figure on a shared machine;
- reconcile: a Stable group of 10 / 100 / 1,000 members on a topic of 2 partitions per member; one more member
  joins; time from its join sent until every member is at the new group epoch and every partition is owned
  again (each partition owned once: the joiner's last partitions come after their owners revoked them). Every
  member heartbeats as a real client does: at the heartbeat interval the server gives (`--interval-ms` on both),
  and at once after its assignment changed (revoking what it was told to, acknowledging with the partitions it
  owns; owned partitions sent only when they changed). The joiner then leaves and the group settles, unmeasured,
  before the next round. Plus the server's CPU time per round: its share of the members' periodic heartbeats
  (the same on both servers) and all the reconciliation's work. The time is bounded below by about two heartbeat
  intervals (revokers hear of the change at their next heartbeat, the joiner of the released partitions at its
  next one) whatever the server; the CPU per round is the figure that tells the servers apart.
- forming (with each of the two above): the time from the first join of the figure's groups (every member joining
  within one heartbeat interval, as clients started together do) until they are settled, and the server's CPU
  for it: the join storm. For our servers, every figure also counts the loop stalls the server logged meanwhile
  (runtime_health's `event=loop_stall` lines, from its log, kept in a temporary file per server) and the longest
  one's CPU time.

Setup as bench.coordinator's (its `start_ours`, pinning and interleaving): one embedded Kafka broker serves as
(b) and holds (a)'s state topic; both servers get the same group.consumer.* settings; our event topic is off
(Kafka has none). The server under test is pinned to CPU 0, the load generator (this process) to CPU 1.
Repeats are interleaved (ours, Kafka, Kafka, ours, ...) and the median is reported.

Two settings of one build side by side (as bench.coordinator's): `--serve-arg` gives our server more serve
arguments, `--baseline-serve-arg` the baseline's; `--serve-arg='--state-writer native' --baseline-tree .
--baseline-serve-arg='--state-writer librdkafka'` races the two state writers in one run, with Kafka.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from bench.coordinator import (LOADGEN_CPU, LoadgenCpu, Server, _server_cpu_ns, _split_args, add_serve_arg_options,
                               await_coordinator, before_and_after, close_all, connect_many, drive_heartbeats,
                               median_of, print_table, ratios, run_interleaved, start_ours, start_profiler,
                               stop_profiler, stop_servers)
from bench.wire import Stats
from bench.cprofiled import OUTPUT_VARIABLE, PROFILE_OFF, PROFILE_ON
from coordinator.embedded import EmbeddedKafka, kafka_version
from protocol import apis, codec
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.errors import ConnectionClosed, RequestTimedOut
from protocol.messages import build, item_class

HEARTBEAT_VERSION = 1
SESSION_MS = 60_000  # Kafka's group.consumer.max.session.timeout.ms: formation of 10,000 members takes a while
REBALANCE_TIMEOUT_MS = 60_000
REQUEST_TIMEOUT_MS = 60_000
UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH = 25, 110
_REQUEST = apis.request_class(ApiKey.CONSUMER_GROUP_HEARTBEAT, HEARTBEAT_VERSION)
_TOPIC_PARTITIONS = item_class(_REQUEST, "topic_partitions")
Owned = dict[uuid.UUID, tuple[int, ...]]


def server_settings(interval_ms: int) -> dict[str, str]:
    """The group.consumer.* settings both servers get."""
    return {"group.consumer.heartbeat.interval.ms": str(interval_ms),
            "group.consumer.min.heartbeat.interval.ms": str(min(interval_ms, 5_000)),
            "group.consumer.session.timeout.ms": str(SESSION_MS),
            "group.consumer.max.session.timeout.ms": str(SESSION_MS)}


# ---------------------------------------------------------------------------------------------- members


def heartbeat_request(group_id: str, member_id: str, epoch: int, *, topics: tuple[str, ...] | None = None,
                      owned: Owned | None = None, full: bool = False) -> Any:
    """ConsumerGroupHeartbeat v1 as a client sends it: a join (epoch 0) carries its subscription, rebalance timeout
    and no partitions; later heartbeats carry only what changed (None: unchanged), unless `full` (after an error
    answer, as Kafka's client resends every field: the server then answers with the whole assignment)."""
    joining = epoch == 0
    full = full or joining
    if joining:
        owned = {}
    return build(_REQUEST, group_id=group_id, member_id=member_id, member_epoch=epoch, instance_id=None,
                 rack_id=None,
                 rebalance_timeout=datetime.timedelta(milliseconds=REBALANCE_TIMEOUT_MS if full else -1),
                 subscribed_topic_names=topics if full else None, subscribed_topic_regex=None,
                 server_assignor=None, topic_partitions=None if owned is None else tuple(
                     _TOPIC_PARTITIONS(topic_id=t, partitions=ps) for t, ps in sorted(owned.items())))


@dataclass
class Member:
    """A consumer-protocol client reduced to its group part: it owns what it was last told, revokes and
    acknowledges at once after a change, and otherwise heartbeats at the interval the server gives."""

    client: KafkaClient
    group_id: str
    topic: str
    member_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    epoch: int = 0
    owned: Owned = field(default_factory=dict)
    acknowledged: Owned | None = None  # the owned partitions the server last heard of
    interval_s: float = 5.0
    errors: int = 0  # error answers (other than fenced/unknown member: those rejoin)
    last_error: str = ""
    latencies_ms: list[float] | None = None  # while a round is watched: each heartbeat's round trip
    # while a round is watched: (sent, answered, epoch after, partitions owned after) of each heartbeat answered,
    # after one entry for the member as the round found it (`watch`)
    beats: list[tuple[float, float, int, int]] | None = None

    def watch(self, now_s: float) -> None:
        self.latencies_ms, self.beats = [], [(now_s, now_s, self.epoch, self.partition_count())]

    def unwatch(self) -> None:
        self.latencies_ms, self.beats = None, None

    async def beat(self) -> bool:
        """One heartbeat (a join at epoch 0); True when the answer changed the member's partitions (a client then
        revokes or assigns and acknowledges at once; a new epoch alone waits for the next interval)."""
        sent = time.perf_counter()
        changed = await self._beat()
        if self.beats is not None:
            self.beats.append((sent, time.perf_counter(), self.epoch, self.partition_count()))
        return changed

    async def _beat(self) -> bool:
        full = self.acknowledged is None
        owned = None if self.acknowledged == self.owned and not full else dict(self.owned)
        body = heartbeat_request(self.group_id, self.member_id, self.epoch, topics=(self.topic,), owned=owned,
                                 full=full)
        sent = time.perf_counter()
        response = await self.client.request(body, timeout_ms=REQUEST_TIMEOUT_MS)
        if self.latencies_ms is not None:
            self.latencies_ms.append((time.perf_counter() - sent) * 1000)
        error = int(response.error_code)
        if error in (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH):  # rejoin with nothing, as a client does
            self.epoch, self.owned, self.acknowledged = 0, {}, None
            return True
        if error:  # retriable (a write not acknowledged in time, a coordinator moving): again at the interval
            self.errors += 1
            self.last_error = f"{error} {response.error_message}"
            self.acknowledged = None  # the next heartbeat is a full one
            return False
        if owned is not None:
            self.acknowledged = owned
        self.interval_s = response.heartbeat_interval.total_seconds()
        self.epoch = int(response.member_epoch)
        if response.assignment is not None:
            assigned = {t.topic_id: tuple(sorted(t.partitions)) for t in response.assignment.topic_partitions
                        if t.partitions}
            if assigned != self.owned:
                self.owned = assigned
                return True
        return False

    async def run(self, stop: asyncio.Event, *, spread: bool = True) -> None:
        """Heartbeats until `stop`: at once after a change (the acknowledgement), else after the interval; with
        `spread` the first wait is a random part of one interval, so that a group's members do not beat in
        lockstep."""
        while not stop.is_set():
            try:
                changed = await self.beat()
            except ConnectionClosed:
                return
            except RequestTimedOut:  # retriable, as Kafka's client has it: a full heartbeat at the next interval
                self.errors += 1
                self.last_error = "request timed out"
                self.acknowledged, changed = None, False
            if changed and not spread:
                continue
            wait_s = self.interval_s * (random.random() if spread else 1.0)
            spread = False
            try:
                await asyncio.wait_for(stop.wait(), wait_s)
            except asyncio.TimeoutError:
                pass

    async def leave(self) -> None:
        try:
            await self.client.request(heartbeat_request(self.group_id, self.member_id, -1),
                                      timeout_ms=REQUEST_TIMEOUT_MS)
        except (ConnectionClosed, RequestTimedOut):
            pass

    def partition_count(self) -> int:
        return sum(len(ps) for ps in self.owned.values())


def settled(members: list[Member], partitions: int, epoch: int | None = None) -> bool:
    """Every member at one epoch (`epoch` if given) and every partition owned once."""
    epochs = {m.epoch for m in members}
    return (len(epochs) == 1 and (epoch is None or epochs == {epoch}) and 0 not in epochs
            and sum(m.partition_count() for m in members) == partitions)


async def wait_settled(members: list[Member], partitions: int, timeout_s: float, epoch: int | None = None) -> None:
    deadline = time.perf_counter() + timeout_s
    while not settled(members, partitions, epoch):
        if time.perf_counter() > deadline:
            epochs = sorted({m.epoch for m in members})
            errors = [m.last_error for m in members if m.last_error]
            raise RuntimeError(f"group {members[0].group_id} did not settle in {timeout_s} s: epochs {epochs[:5]}, "
                               f"{sum(m.partition_count() for m in members)} of {partitions} partitions owned, "
                               f"{len(errors)} members had errors (last: {errors[-1:]})")
        await asyncio.sleep(0.002)


class RunningGroup:
    """Members heartbeating in the background, as a live group's clients do."""

    def __init__(self, members: list[Member]) -> None:
        self.members = members
        self.stop = asyncio.Event()
        self.tasks = [asyncio.ensure_future(m.run(self.stop)) for m in members]

    def add(self, member: Member) -> None:
        """A member that joined already: its next heartbeat acknowledges what the join gave it."""
        self.members.append(member)
        self.tasks.append(asyncio.ensure_future(member.run(self.stop, spread=False)))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*(m.leave() for m in self.members if m.epoch > 0))


class HeartbeatStats(Stats):
    """Counts ConsumerGroupHeartbeat answers: the error code follows the flexible response header and throttle."""

    def record(self, latency_ns: int, response: bytes) -> None:
        if self.measuring and response[13:15] != b"\x00\x00":
            self.errors += 1
        super().record(latency_ns, b"")


# ---------------------------------------------------------------------------------------------- topics


def create_topics(bootstrap: str, partitions: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, count, 1) for name, count in partitions.items()])
    for future in futures.values():
        future.result(120)


def heartbeat_topic(group_size: int) -> str:
    return f"cgh-{group_size}"


def reconcile_topic(size: int) -> str:
    return f"reconcile-{size}"


async def await_served(client: KafkaClient, group_id: str, topic: str) -> None:
    """A join answered without a coordinator error (Kafka creates its offsets topic on first use; ours loads its
    state), then left again: the figures start on a coordinator that serves."""
    await await_coordinator(client, group_id)
    for _ in range(240):
        probe = Member(client, group_id, topic)
        response = await client.request(heartbeat_request(group_id, probe.member_id, 0, topics=(topic,)),
                                        timeout_ms=REQUEST_TIMEOUT_MS)
        if int(response.error_code) == 0:
            probe.epoch = int(response.member_epoch)
            await probe.leave()
            return
        if int(response.error_code) not in (14, 15, 16):
            raise RuntimeError(f"probe join: error {int(response.error_code)} {response.error_message}")
        await asyncio.sleep(0.25)
    raise RuntimeError("the coordinator did not serve consumer groups within 60 s")


# ---------------------------------------------------------------------------------------------- figures


class StallLog:
    """A server's log in a file; the loop stalls it reported since a mark (runtime_health's lines)."""

    def __init__(self, name: str) -> None:
        self.path = os.path.join(tempfile.gettempdir(), f"bench-consumer-protocol-{name}-{os.getpid()}.log")
        self.file = open(self.path, "w+")  # noqa: SIM115 (the server writes it until it stops)

    def mark(self) -> int:
        return os.path.getsize(self.path)

    def since(self, mark: int) -> dict[str, float]:
        with open(self.path, errors="replace") as log:
            log.seek(mark)
            stalls = [float(field.split("=", 1)[1]) for line in log if "event=loop_stall" in line
                      for field in line.split() if field.startswith("cpu_ms=")]
        return {"loop_stalls": len(stalls), "longest_stall_cpu_ms": round(max(stalls, default=0.0), 1)}


STALL_LOGS: dict[str, StallLog] = {}  # server name -> its log (ours and the baseline tree's)


def stalls_since(server: Server, mark: int | None) -> dict[str, float]:
    log = STALL_LOGS.get(server.name)
    return {} if log is None or mark is None else log.since(mark)


def stall_mark(server: Server) -> int | None:
    log = STALL_LOGS.get(server.name)
    return None if log is None else log.mark()


async def heartbeat_figures(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    size, topic = args.group_size, heartbeat_topic(args.group_size)
    pool = await connect_many(server.port, min(max(args.connections), args.groups * size))
    await await_served(pool[0], f"probe-{uuid.uuid4().hex[:6]}", topic)
    prefix = uuid.uuid4().hex[:6]
    groups = [[Member(pool[(g * size + i) % len(pool)], f"cgh-{prefix}-{g}", topic) for i in range(size)]
              for g in range(args.groups)]
    members = [m for group in groups for m in group]
    figures: dict[str, Any] = {}
    try:
        mark, cpu_before, started = stall_mark(server), _server_cpu_ns(server.pid), time.perf_counter()
        running = [RunningGroup(group) for group in groups]  # formed at the server's interval, as clients do
        try:
            await asyncio.gather(*(wait_settled(g, size, 300) for g in groups))
            figures["forming"] = {"form_ms": round((time.perf_counter() - started) * 1000, 1),
                                  "server_cpu_ms": round((_server_cpu_ns(server.pid) - cpu_before) / 1e6, 1),
                                  **stalls_since(server, mark)}
        finally:
            for group in running:
                group.stop.set()
            await asyncio.gather(*(t for group in running for t in group.tasks), return_exceptions=True)
        frames = [codec.encode_request(0, "bench", heartbeat_request(m.group_id, m.member_id, m.epoch))
                  for m in members]
        random.shuffle(frames)  # each connection cycles through members of many groups
        for connections in args.connections:
            profiled = connections == max(args.connections)
            profiler = start_profiler(server, args) if profiled and args.profiler == "py-spy" else None
            cprofiled = profiled and args.profiler == "cprofile" and args.profile and server.name == "ours"
            if cprofiled:
                os.kill(server.pid, PROFILE_ON)
            try:
                mark = stall_mark(server)
                figures[str(connections)] = await drive_heartbeats(server, frames, connections, args.seconds,
                                                                   stats=HeartbeatStats())
                figures[str(connections)].update(stalls_since(server, mark))
            finally:
                stop_profiler(profiler)
                if cprofiled:
                    os.kill(server.pid, PROFILE_OFF)
        return figures
    finally:
        await asyncio.gather(*(m.leave() for m in members if m.epoch > 0))
        await close_all(pool)


async def reconcile_figures(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    figures = {}
    for size in args.reconcile_sizes:
        topic, partitions = reconcile_topic(size), 2 * size
        clients = await connect_many(server.port, min(size + 1, args.reconcile_connections))
        group_id = f"rc-{uuid.uuid4().hex[:6]}-{size}"
        await await_served(clients[0], group_id, topic)
        mark, cpu_before, started = stall_mark(server), _server_cpu_ns(server.pid), time.perf_counter()
        group = RunningGroup([Member(clients[i % len(clients)], group_id, topic) for i in range(size)])
        times, cpu_ms, own_shares, watched = [], [], [], []
        try:
            await wait_settled(group.members, partitions, 300)
            forming = {"form_ms": round((time.perf_counter() - started) * 1000, 1),
                       "form_server_cpu_ms": round((_server_cpu_ns(server.pid) - cpu_before) / 1e6, 1),
                       **{f"form_{key}": value for key, value in stalls_since(server, mark).items()}}
            mark = stall_mark(server)
            for round_number in range(args.reconcile_warmup + args.reconcile_rounds):
                joiner = Member(clients[size % len(clients)], group_id, topic)
                await asyncio.sleep(args.interval_ms / 1000)  # the settled group heartbeats a while first
                for member in (*group.members, joiner):
                    member.watch(time.perf_counter())
                cpu_before = _server_cpu_ns(server.pid)
                measured = round_number >= args.reconcile_warmup
                # `--profile F --profiler cprofile --figures reconcile`: our server's main thread during the measured
                # rounds of the largest size (cProfile's statistics accumulate over them)
                cprofiled = (measured and args.profiler == "cprofile" and args.profile and server.name == "ours"
                             and "consumer-heartbeat" not in args.figures and size == max(args.reconcile_sizes))
                if cprofiled:
                    os.kill(server.pid, PROFILE_ON)
                if measured:
                    _trace_mark(server, "round_start", size)
                with LoadgenCpu() as own:
                    started = time.perf_counter()
                    await joiner.beat()
                    target_epoch = joiner.epoch
                    group.add(joiner)
                    await wait_settled(group.members, partitions, 120, target_epoch)
                    elapsed_ms = (time.perf_counter() - started) * 1000
                cpu_used_ms = (_server_cpu_ns(server.pid) - cpu_before) / 1e6
                if cprofiled:
                    os.kill(server.pid, PROFILE_OFF)
                if measured:
                    _trace_mark(server, "round_end", size)
                    times.append(elapsed_ms)
                    cpu_ms.append(cpu_used_ms)
                    own_shares.append(own.share)
                    watched.append(_round_detail(group.members, joiner, started, target_epoch,
                                                 started + elapsed_ms / 1000))
                for member in group.members:
                    member.unwatch()
                # the joiner leaves again; the group settles before the next round (unmeasured)
                index = group.members.index(joiner)
                group.members.pop(index)
                task = group.tasks.pop(index)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await joiner.leave()
                await wait_settled(group.members, partitions, 120)
            error_answers = sum(m.errors for m in group.members)
            rounds_stalls = stalls_since(server, mark)
        finally:
            await group.close()
            await close_all(clients)
        times.sort()
        figures[str(size)] = {
            "reconcile_ms_median": round(times[len(times) // 2], 2), "reconcile_ms_max": round(times[-1], 2),
            "server_cpu_ms_per_round": round(sorted(cpu_ms)[len(cpu_ms) // 2], 2),
            "loadgen_cpu_share": round(max(own_shares), 2), "error_answers": error_answers, **forming,
            **{f"rounds_{key}": value for key, value in rounds_stalls.items()},
            **{key: round(statistics.median(r[key] for r in watched), 1) for key in watched[0]}, "rounds": watched}
        print(f"{server.name} reconcile {size}: {json.dumps(figures[str(size)])} "
              f"(load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    return figures


def _trace_mark(server: Server, event: str, size: int) -> None:
    """A measured round's start or end in bench.reconcile_trace's file (RECONCILE_TRACE), on its clock; our
    server only (the one the trace's sitecustomize stamps)."""
    path = os.environ.get("RECONCILE_TRACE")
    if path and server.name == "ours":
        with open(path, "a") as trace:
            trace.write(f"{time.monotonic():.6f} {event} {size}\n")


def _round_detail(members: list[Member], joiner: Member, started: float, target_epoch: int,
                  ended: float) -> dict[str, Any]:
    """What the members of a measured round waited for: when each first heard the new epoch (ms after the join
    was sent: its first answer at `target_epoch`; none by the round's end counts as the end), the round trips of
    every heartbeat meanwhile, and the chain the round's end waited for (`_critical_path`)."""
    reached = sorted((_first_answer(m, lambda b: b[2] == target_epoch, ended) - started) * 1000
                     for m in members if m is not joiner)
    latencies = sorted(latency for m in members for latency in (m.latencies_ms or ()))

    def at(values: list[float], share: float) -> float:
        return round(values[min(int(share * len(values)), len(values) - 1)], 1) if values else 0.0

    return {"epoch_heard_ms_p50": at(reached, 0.5), "epoch_heard_ms_p90": at(reached, 0.9),
            "epoch_heard_ms_max": at(reached, 1.0), "heartbeats": len(latencies),
            "heartbeat_ms_p50": at(latencies, 0.5), "heartbeat_ms_p90": at(latencies, 0.9),
            "heartbeat_ms_p99": at(latencies, 0.99), "heartbeat_ms_max": at(latencies, 1.0),
            **_critical_path(members, joiner, started, target_epoch, ended, reached)}


def _first_answer(member: Member, test: Any, otherwise: float) -> float:
    """When the member's first heartbeat of the round whose (sent, answered, epoch, partitions) passes `test`
    was answered; `otherwise` if none did."""
    return next((b[1] for b in (member.beats or [])[1:] if test(b)), otherwise)


def _critical_path(members: list[Member], joiner: Member, started: float, target_epoch: int, ended: float,
                   reached_ms: list[float]) -> dict[str, float]:
    """The chain a round's end waits for, in ms after the join was sent: the joiner's join (`join_ms`), its
    acknowledgement right after (`joiner_ack_ms`, a heartbeat that changes nothing), the wait of one interval, then
    the heartbeat that gave it the partitions the revokers released (`joiner_done_ms` when answered,
    `joiner_done_rtt_ms` its round trip, `joiner_waited_ms` the wait before it was sent); the revokers' side (when
    the last one was told to revoke and when its acknowledgement was answered); and the last member to hear the
    new epoch. `joiner_bound` 1: the round ended with the joiner's partitions (else with a member hearing the
    epoch)."""
    ms = lambda t: round((t - started) * 1000, 1)  # noqa: E731
    rtt = lambda b: round((b[1] - b[0]) * 1000, 1)  # noqa: E731
    beats = (joiner.beats or [])[1:]
    final = joiner.partition_count()
    done_index = next((i for i, b in enumerate(beats) if b[3] == final and b[2] == target_epoch), len(beats) - 1)
    done = beats[done_index] if beats else (ended, ended, 0, 0)
    told, acked, revokers = started, started, 0
    for member in members:
        seen = member.beats or []
        drop = next((i for i in range(1, len(seen)) if seen[i][3] < seen[i - 1][3]), None)
        if member is joiner or drop is None:
            continue
        revokers += 1
        told = max(told, seen[drop][1])
        if drop + 1 < len(seen):
            acked = max(acked, seen[drop + 1][1])
    last_heard = max(reached_ms, default=0.0)
    return {"join_ms": rtt(beats[0]) if beats else 0.0, "joiner_ack_ms": rtt(beats[1]) if len(beats) > 1 else 0.0,
            "joiner_waited_ms": round((done[0] - beats[done_index - 1][1]) * 1000, 1) if done_index > 0 else 0.0,
            "joiner_done_rtt_ms": rtt(done), "joiner_done_ms": ms(done[1]), "joiner_beats": len(beats),
            "revokers": revokers, "revoke_told_ms": ms(told), "revoke_acked_ms": ms(acked),
            "last_heard_ms": round(last_heard, 1), "joiner_bound": 1.0 if ms(done[1]) >= last_heard else 0.0}


# ---------------------------------------------------------------------------------------------- orchestration


async def run_server_figures(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    if "consumer-heartbeat" in args.figures:
        figures["consumer_heartbeat"] = await heartbeat_figures(server, args)
        print(f"{server.name} consumer_heartbeat: {json.dumps(figures['consumer_heartbeat'])} "
              f"(load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    if "reconcile" in args.figures:
        figures["reconcile"] = await reconcile_figures(server, args)
    return figures


async def main(args: argparse.Namespace) -> dict[str, Any]:
    os.sched_setaffinity(0, {LOADGEN_CPU})
    settings = server_settings(args.interval_ms)
    broker = EmbeddedKafka(extra_properties=settings)
    await broker.start()
    processes: list[subprocess.Popen] = []
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        topics = {heartbeat_topic(args.group_size): args.group_size} if "consumer-heartbeat" in args.figures else {}
        if "reconcile" in args.figures:
            topics.update({reconcile_topic(size): 2 * size for size in args.reconcile_sizes})
        await asyncio.to_thread(create_topics, broker.bootstrap, topics)
        profiled: dict[str, Any] = {}
        if args.profile and args.profiler == "cprofile":
            profiled = {"module": "bench.cprofiled", "environment": {OUTPUT_VARIABLE: os.path.abspath(args.profile)}}
        for attempt in range(3):  # the broker may be slow to answer right after making thousands of partitions
            try:
                STALL_LOGS["ours"] = StallLog("ours")
                process, ours = await start_ours(broker.bootstrap,
                                                 config=[f"{k}={v}" for k, v in settings.items()],
                                                 stderr=STALL_LOGS["ours"].file, serve_args=_split_args(args.serve_arg),
                                                 **profiled)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        processes.append(process)
        servers = [ours]
        if args.baseline_tree:
            STALL_LOGS["before"] = StallLog("before")
            process, before = await start_ours(broker.bootstrap, "before", args.baseline_tree,
                                               config=[f"{k}={v}" for k, v in settings.items()],
                                               stderr=STALL_LOGS["before"].file,
                                               serve_args=_split_args(args.baseline_serve_arg))
            processes.append(process)
            servers.append(before)
        kafka = Server(f"kafka-{kafka_version()}", int(broker.bootstrap.rsplit(":", 1)[1]), broker.pid or 0)
        servers.append(kafka)
        results = {server.name: [] for server in servers}
        await run_interleaved(servers, args, run_server_figures, results, load_average=True)
    finally:
        await stop_servers(processes, broker)
    medians = {name: median_of(runs) for name, runs in results.items()}
    ours_median, kafka_median = medians["ours"], medians[kafka.name]
    ratio = ratios(ours_median, kafka_median)
    load = os.getloadavg()
    print(f"\nmedians of {args.repeats} interleaved repeats; ratio = ours / Kafka {kafka_version()} "
          f"(load average at the end {load[0]:.1f}, {os.cpu_count()} CPUs; heartbeat interval {args.interval_ms} ms):")
    print_table(ours_median, kafka_median, ratio)
    summary = {"bench": "consumer_protocol", "kafka_version": kafka_version(), "repeats": args.repeats,
               "interval_ms": args.interval_ms, "load_average_1m": round(load[0], 1), "ours": ours_median,
               "kafka": kafka_median, "ratio": ratio}
    if "before" in medians:
        summary.update(before_and_after(medians["before"], ours_median, kafka_median, args.baseline_tree))
    summary["server_logs"] = {name: log.path for name, log in STALL_LOGS.items()}
    summary["runs"] = results
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sizes = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per heartbeat figure")
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--group-size", type=int, default=10)
    parser.add_argument("--connections", type=sizes, default=[100, 1000])
    parser.add_argument("--reconcile-sizes", type=sizes, default=[10, 100, 1000])
    parser.add_argument("--reconcile-rounds", type=int, default=3)
    parser.add_argument("--reconcile-warmup", type=int, default=1, help="unmeasured rounds per size first")
    parser.add_argument("--reconcile-connections", type=int, default=100,
                        help="connections the reconciling group's members share")
    parser.add_argument("--interval-ms", type=int, default=250, help="group.consumer.heartbeat.interval.ms of both")
    parser.add_argument("--figures", default="consumer-heartbeat,reconcile")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    parser.add_argument("--baseline-tree", help="a source tree of ours to race as 'before' (bench.coordinator's)")
    add_serve_arg_options(parser)
    parser.add_argument("--profile", help="profile of our server during the heartbeats over the most connections "
                        "(every repeat's overwrites the last): py-spy's raw output, or cProfile's pstats file; with "
                        "--figures reconcile and cprofile: the measured rounds of the largest size")
    parser.add_argument("--profiler", choices=["py-spy", "cprofile"], default="py-spy",
                        help="cprofile: every call on the server's main thread (bench/cprofiled.py)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    from bench import run_and_print

    arguments = parse_args()
    run_and_print(main(arguments), arguments.loop)
