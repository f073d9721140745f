"""Failover time: SIGKILL a coordinator instance that serves N groups; how long until every one of them is served
again by another instance and its member's heartbeat is accepted there, in the same generation.

  python -m bench.failover [--groups 1000[,10000,100000]] [--instances 3] [--partitions 12]
                           [--groups-per-connection 100] [--baseline] [--bootstrap-server HOST:PORT]

For each size N: three `coordinator serve --instance-id` processes on a fresh state topic (the harness of
tests/support/instances.py, black-box); N one-member groups whose state partitions the victim owns, formed
against it (JoinGroup, SyncGroup: one state record each) and heartbeating every 10 s; then SIGKILL. Each member
behaves like a client: its connection drops, it asks FindCoordinator (v4 batches: one request per connection of
`--groups-per-connection` members, backing off 100 ms doubling to 1 s like librdkafka), connects to the instance
named and heartbeats with its member id and generation until the answer is NONE. A group counts as recovered at
that answer. Members share connections (`--groups-per-connection`) so 100k groups fit the open-file limit; a
connection carries its members' requests in order, like the coordinator's one-request-at-a-time rule.

Figures (final JSON line, one entry per size): time from SIGKILL to the victim leaving the instances group at the
broker (detection: the instance session timeout), to the first and the last group recovered, p50/p99; the
survivors' own load figures from their logs (event=partitions_loaded: groups, duration_ms); the survivors' CPU
seconds from SIGKILL to the last recovery, per 1,000 moved groups. With --baseline the same N groups are also
served by one single-instance coordinator (no --instance-id) that is SIGKILLed and started again at once (what
a crash meant before several instances): its time to the last recovery, and the ratio failover ÷ restart.

Target (issue 10): 10k groups moved in ≤ 10 s. The instance session timeout (6 s, Kafka's minimum by default) is
most of it: Kafka notices the dead instance only then.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import re
import resource
import sys
import time
from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import Any

from bench import run_and_print
from coordinator.loadgen import wire
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.consumer_protocol import Assignment, Subscription, encode_assignment, encode_subscription
from protocol.error_codes import Errors
from protocol.errors import ConnectionClosed, ProtocolError, RequestTimedOut
from tests.support.instances import Instance, Instances, groups_in_partitions, unique
from tests.support.polling import wait_until
from tests.support.wire import request

TRANSIENT = (ConnectionClosed, RequestTimedOut, ProtocolError, OSError, asyncio.TimeoutError)
NONE, MEMBER_ID_REQUIRED, UNKNOWN_MEMBER_ID = Errors.NONE, Errors.MEMBER_ID_REQUIRED, Errors.UNKNOWN_MEMBER_ID
ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS = Errors.ILLEGAL_GENERATION, Errors.REBALANCE_IN_PROGRESS
COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR = Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.NOT_COORDINATOR
COORDINATOR_NOT_AVAILABLE = Errors.COORDINATOR_NOT_AVAILABLE
MEMBER_SESSION_MS = 120_000  # members outlive formation and failover; they heartbeat every 10 s meanwhile
HEARTBEAT_S = 10.0
TOPIC = "bench-failover"
PARTITIONS_LOADED = re.compile(r"event=partitions_loaded partitions=\[([^\]]*)\] groups=(\d+) duration_ms=(\d+)")
STATE_LOADED = re.compile(r"event=state_loaded topic=\S+ partitions=(\d+) groups=(\d+) .*?duration_ms=(\d+)")
SUBSCRIPTION = encode_subscription(Subscription((TOPIC,)))
ASSIGNMENT = encode_assignment(Assignment(((TOPIC, (0,)),)))


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Member:
    group_id: str
    member_id: str = ""
    generation: int = -1
    recovered_s: float | None = None


@dataclass
class Shared:
    """Members over one connection (like the coordinator's other clients, one request at a time on the server)."""

    members: list[Member]
    address: tuple[str, int]
    client: KafkaClient | None = None
    lost: list[str] = field(default_factory=list)  # groups that lost their member (UNKNOWN_MEMBER_ID): a failure
    unserved_heartbeats: int = 0  # before the kill: answered NOT_COORDINATOR / loading (a stalled instance)

    async def connect(self) -> KafkaClient:
        if self.client is None or self.client.is_closed:
            self.client = await KafkaClient.connect(*self.address, client_id="bench-failover", timeout_ms=60_000)
        return self.client

    async def form(self) -> None:
        """Every group of this connection joined (again with its id after MEMBER_ID_REQUIRED) and synced, requests
        pipelined. Like a client: UNKNOWN_MEMBER_ID resets the member id and rejoins (an instance that dropped and
        re-read its groups after a stall forgets the ids it handed out but never stored), a failed sync rejoins,
        loading / not served (the zombie guard's suspension) is retried after a pause."""
        client = await self.connect()
        phase = {m.group_id: "join" for m in self.members}
        for _round in range(300):
            todo = [m for m in self.members if phase[m.group_id] != "done"]
            if not todo:
                return
            answers = await asyncio.gather(*(client.send(self._request(client, phase[m.group_id], m),
                                                         timeout_ms=120_000) for m in todo))
            retry = False
            for member, answer in zip(todo, answers):
                code = int(answer.error_code)
                joining = phase[member.group_id] == "join"
                if joining and code in (NONE, MEMBER_ID_REQUIRED):
                    member.member_id, member.generation = answer.member_id, answer.generation_id
                    phase[member.group_id] = "sync" if code == NONE else "join"
                elif not joining and code == NONE:
                    phase[member.group_id] = "done"
                elif code in (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS):
                    if code == UNKNOWN_MEMBER_ID:
                        member.member_id = ""
                    phase[member.group_id] = "join"
                elif code in (COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR):
                    retry = True  # the owner does not change here: no rediscovery, just a pause
                else:
                    raise RuntimeError(f"{phase[member.group_id]} {member.group_id}: error {code}")
            if retry:
                await asyncio.sleep(0.2)
        raise RuntimeError(f"{sum(p != 'done' for p in phase.values())} groups not formed after 300 rounds")

    @staticmethod
    def _request(client: KafkaClient, phase: str, m: Member) -> Any:
        if phase == "join":
            return wire.join_group(client, m.group_id, m.member_id, None, MEMBER_SESSION_MS, 60_000, "range",
                                   SUBSCRIPTION, None)
        return wire.sync_group(client, m.group_id, m.generation, m.member_id, None, "range",
                               {m.member_id: ASSIGNMENT})

    async def heartbeat(self, members: list[Member]) -> list[int]:
        client = await self.connect()
        frames = [wire.HeartbeatFrame(client, m.group_id, m.generation, m.member_id, None) for m in members]
        answers = await asyncio.gather(*(f.send(client, 60_000) for f in frames))
        return [frame.error_code(answer) for frame, answer in zip(frames, answers)]

    async def keep_alive(self, stop: asyncio.Event) -> None:
        """Heartbeat every HEARTBEAT_S until `stop` (the kill) or the connection drops."""
        while not stop.is_set():
            try:
                codes = await self.heartbeat(self.members)
            except TRANSIENT:
                return
            retriable = (COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR)
            self.unserved_heartbeats += sum(1 for code in codes if code in retriable)
            if any(code and code not in retriable for code in codes):
                raise RuntimeError(f"heartbeat errors before the kill: {sorted(set(codes))}")
            try:
                await asyncio.wait_for(stop.wait(), HEARTBEAT_S)
            except asyncio.TimeoutError:
                pass

    async def recover(self, lookup: list[tuple[str, int]], killed_at: float) -> None:
        """After the kill: rediscover (FindCoordinator v4 batches at any live instance), heartbeat at the named
        coordinator, until every member's heartbeat is accepted; backoff 100 ms doubling to 1 s."""
        pending = {m.group_id: m for m in self.members}
        connections: dict[tuple[str, int], KafkaClient] = {}
        backoff_s = 0.1
        turn = 0
        try:
            while pending:
                turn += 1
                owners = await _find_coordinators(lookup[turn % len(lookup)], list(pending))
                by_owner: dict[tuple[str, int], list[Member]] = {}
                for group_id, owner in owners.items():
                    if owner is not None:
                        by_owner.setdefault(owner, []).append(pending[group_id])
                for owner, members in by_owner.items():
                    try:
                        client = connections.get(owner)
                        if client is None or client.is_closed:
                            client = connections[owner] = await KafkaClient.connect(
                                *owner, client_id="bench-failover", timeout_ms=10_000)
                        frames = [wire.HeartbeatFrame(client, m.group_id, m.generation, m.member_id, None)
                                  for m in members]
                        answers = await asyncio.gather(*(f.send(client, 30_000) for f in frames))
                    except TRANSIENT:
                        connections.pop(owner, None)
                        continue
                    now = time.monotonic() - killed_at
                    for member, frame, answer in zip(members, frames, answers):
                        code = frame.error_code(answer)
                        if code == NONE:
                            member.recovered_s = now
                            del pending[member.group_id]
                        elif code in (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION):
                            self.lost.append(member.group_id)  # the group forgot its member: not a failover
                            del pending[member.group_id]
                if pending:
                    await asyncio.sleep(backoff_s)
                    backoff_s = min(1.0, backoff_s * 2)
        finally:
            for client in connections.values():
                await client.close()


async def _find_coordinators(address: tuple[str, int], group_ids: list[str]) -> dict[str, tuple[str, int] | None]:
    """group id -> the coordinator FindCoordinator names (None: not available now, or this instance is down)."""
    try:
        client = await KafkaClient.connect(*address, client_id="bench-failover", timeout_ms=10_000)
    except TRANSIENT:
        return {}
    try:
        response = await client.request(request(ApiKey.FIND_COORDINATOR, 4, key_type=0,
                                                coordinator_keys=tuple(group_ids)))
        return {c.key: ((c.host, int(c.port)) if c.error_code == NONE else None) for c in response.coordinators}
    except TRANSIENT:
        return {}
    finally:
        await client.close()


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(values: list[float], fraction: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


async def _form(victim: Instance, group_ids: list[str], per_connection: int, stop: asyncio.Event
                ) -> tuple[list[Shared], list[asyncio.Future]]:
    """Every group formed at the victim; each connection's members heartbeat from the moment they are formed
    (forming 100k groups takes minutes: longer than a session) until `stop`. Returns the connections and their
    heartbeat tasks."""
    shared = [Shared([Member(g) for g in group_ids[i:i + per_connection]], victim.address)
              for i in range(0, len(group_ids), per_connection)]
    started = time.monotonic()
    formed = 0
    slots = asyncio.Semaphore(256)  # connections forming at once: enough to fill the store's write batches
    alive: list[asyncio.Future] = []

    async def form(one: Shared) -> None:
        nonlocal formed
        async with slots:
            await one.form()
        formed += len(one.members)
        alive.append(asyncio.ensure_future(one.keep_alive(stop)))

    tasks = [asyncio.ensure_future(form(one)) for one in shared]
    while not all(t.done() for t in tasks):
        await asyncio.wait(tasks, timeout=2)
        log(f"  formed {formed:,}/{len(group_ids):,} groups ({time.monotonic() - started:.0f} s)")
    for task in tasks:
        task.result()
    return shared, alive


async def _measure(cluster: Instances, victim: Instance, shared: list[Shared], alive: list[asyncio.Future],
                   stop: asyncio.Event, lookup: list[tuple[str, int]], moved: set[int],
                   restart: bool) -> dict[str, Any]:
    """SIGKILL the victim (and with `restart`, start it again at once); time every member's recovery."""
    for task in alive:
        if task.done():
            task.result()  # a member that failed before the kill fails the run
    others = [i for i in cluster if i is not victim]
    since = {i.instance_id: i.log_offset() for i in cluster}
    cpu_before = {i.instance_id: _cpu_s(i.pid) for i in others}
    killed_at = time.monotonic()
    await victim.kill()
    stop.set()
    await asyncio.gather(*alive, return_exceptions=True)
    if restart:
        victim.start()
    detected: list[float] = []

    async def watch_detection() -> None:
        if restart:
            return
        await wait_until(lambda: _victim_gone(cluster, victim), 120, "the victim out of the instances group", 0.1)
        detected.append(time.monotonic() - killed_at)

    watcher = asyncio.ensure_future(watch_detection())
    recovering = [asyncio.ensure_future(one.recover(lookup, killed_at)) for one in shared]
    total = sum(len(one.members) for one in shared)
    while not all(t.done() for t in recovering):
        await asyncio.wait(recovering, timeout=1)
        done = sum(1 for one in shared for m in one.members if m.recovered_s is not None)
        log(f"  {time.monotonic() - killed_at:5.1f} s after SIGKILL: {done:,}/{total:,} groups recovered")
    for task in recovering:
        task.result()
    cpu_s = sum(_cpu_s(i.pid) - cpu_before[i.instance_id] for i in others)
    await asyncio.wait_for(watcher, 120)
    times = [m.recovered_s for one in shared for m in one.members if m.recovered_s is not None]
    lost = [g for one in shared for g in one.lost]
    loads = await _loads(cluster if restart else others, since, moved, restart)
    assert not lost, f"{len(lost)} groups forgot their member in the failover: {lost[:5]}"
    return {
        "groups": total, "recovered": len(times), "lost_member": len(lost),
        "unserved_heartbeats_before_kill": sum(one.unserved_heartbeats for one in shared),
        "detection_s": round(detected[0], 2) if detected else None,
        "first_s": round(min(times), 2) if times else None,
        "p50_s": round(_percentile(times, 0.5), 2) if times else None,
        "p99_s": round(_percentile(times, 0.99), 2) if times else None,
        "last_s": round(max(times), 2) if times else None,
        "loads": [{"instance": i, "groups": g, "duration_ms": ms} for i, g, ms in loads if g],
        "survivor_cpu_s": round(cpu_s, 2) if not restart else None,
        "survivor_cpu_ms_per_1k_groups": round(cpu_s * 1000 / total * 1000, 1) if total and not restart else None,
    }


async def _loads(instances: Iterable[Instance], since: dict[str, int], moved: set[int],
                 restart: bool) -> list[tuple[str, int, int]]:
    """(instance, groups, duration_ms) of the loads the instances logged after the kill: the moved partitions
    (event=partitions_loaded), or the restarted instance's whole state (event=state_loaded). Waits a little for
    the lines (an instance may log a load after it has begun serving it); figures only, never a failure."""
    pattern = STATE_LOADED if restart else PARTITIONS_LOADED

    def found() -> list[tuple[str, set[int], int, int]]:
        return [(i.instance_id, {int(p) for p in parts.split(",") if p.strip()} if not restart else moved,
                 int(groups), int(ms))
                for i in instances for parts, groups, ms in pattern.findall(i.log_text(since[i.instance_id]))]

    try:
        await wait_until(lambda: moved <= {p for _i, parts, _g, _ms in found() for p in parts}, 30,
                         "the load lines in the logs", 0.2)
    except AssertionError:
        log("  (not every moved partition's load line was found in the logs)")
    return [(instance, groups, ms) for instance, parts, groups, ms in found() if parts & moved]


async def _victim_gone(cluster: Instances, victim: Instance) -> bool:
    ownership = await cluster.ownership()
    return victim.instance_id not in ownership.members and ownership.complete(cluster.partitions)


async def run_size(bootstrap: str, groups: int, args: argparse.Namespace, baseline: bool) -> dict[str, Any]:
    """One failover (or, `baseline`, one single-instance kill and restart) with `groups` groups on the victim."""
    count = 1 if baseline else args.instances
    log_dir = None
    if args.keep_logs:
        log_dir = os.path.join(args.keep_logs, f"{'restart' if baseline else 'failover'}-{groups}")
    async with Instances(bootstrap, count, partitions=args.partitions, multi=not baseline,
                         instance_session_ms=args.instance_session_timeout_ms, log_dir=log_dir,
                         event_topic="") as cluster:
        victim = cluster[f"i{count}"]
        if baseline:
            owned = set(range(args.partitions))
        else:
            owned = (await cluster.ownership()).of(victim.instance_id)
        group_ids = groups_in_partitions(owned, groups, args.partitions, unique("bench"))
        log(f"{'baseline (one instance, kill and restart)' if baseline else 'failover'}: {groups:,} groups on "
            f"{victim.instance_id} (state partitions {sorted(owned)})")
        stop = asyncio.Event()
        shared, alive = await _form(victim, group_ids, args.groups_per_connection, stop)
        lookup = [i.address for i in cluster if i is not victim] or [victim.address]
        try:
            figures = await _measure(cluster, victim, shared, alive, stop, lookup, owned, restart=baseline)
        finally:
            stop.set()
            for one in shared:
                if one.client is not None:
                    await one.client.close()
        log(f"  -> last group recovered {figures['last_s']} s after SIGKILL (detection {figures['detection_s']} s)")
        return figures


async def main(args: argparse.Namespace) -> dict[str, Any]:
    # a write to a connection the SIGKILL just reset is expected here: not worth asyncio's warning per socket
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    sizes = [int(s) for s in args.groups.split(",")]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    broker = None
    bootstrap = args.bootstrap_server
    if bootstrap is None:
        from coordinator.embedded import EmbeddedKafka

        broker = EmbeddedKafka()
        await broker.start()
        bootstrap = broker.bootstrap
    results: dict[str, Any] = {"bench": "failover", "instances": args.instances, "partitions": args.partitions,
                               "instance_session_timeout_ms": args.instance_session_timeout_ms,
                               "groups_per_connection": args.groups_per_connection, "loadavg_start": os.getloadavg()[0],
                               "sizes": {}}
    try:
        for size in sizes:
            entry: dict[str, Any] = {"failover": await run_size(bootstrap, size, args, baseline=False)}
            if args.baseline:
                entry["restart"] = await run_size(bootstrap, size, args, baseline=True)
                f, r = entry["failover"]["last_s"], entry["restart"]["last_s"]
                entry["ratio_failover_to_restart"] = round(f / r, 2) if f and r else None
            if size == 10_000:  # the target: 10k groups moved in at most 10 s
                entry["target_10k_in_10s_met"] = (entry["failover"]["last_s"] or float("inf")) <= 10
            results["sizes"][str(size)] = entry
    finally:
        if broker is not None:
            await broker.stop()
            broker.remove_data()
    results["loadavg_end"] = os.getloadavg()[0]
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--groups", default="1000",
                        help="comma-separated sizes: groups on the killed instance (default 1000, CI-friendly; "
                             "the issue's sizes are 1000,10000,100000)")
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=12, help="state-topic partitions")
    parser.add_argument("--groups-per-connection", type=int, default=100,
                        help="members sharing one connection (100k groups need 1,000 sockets at 100)")
    parser.add_argument("--instance-session-timeout-ms", type=int, default=6_000)
    parser.add_argument("--baseline", action="store_true",
                        help="also time a single-instance coordinator killed and restarted with the same groups")
    parser.add_argument("--keep-logs", metavar="DIR", help="keep the instances' logs under DIR")
    parser.add_argument("--bootstrap-server", default=None, help="a Kafka cluster (default: an embedded broker)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    run_and_print(main(parse_args()), "asyncio")
