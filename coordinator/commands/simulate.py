"""`coordinator simulate`: simulated consumers, with failure injection, against any Kafka group coordinator."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from coordinator.commands import host_port, stop_on_signals


def add_parser(commands: Any) -> None:
    env = os.environ.get
    simulate = commands.add_parser(
        "simulate", help="simulated consumers (with failure injection) against any Kafka group coordinator",
        description="Protocol-level test consumers: G groups x M members join, sync (a real assignor in each "
                    "leader), heartbeat and commit like Kafka's consumer, while failures are injected. Shows a live "
                    "status, then a summary (rebalances by reason and duration, failures detected, detection "
                    "lateness, error codes).")
    simulate.add_argument("--coordinator", type=_host_ports, default=None,
                          help="HOST:PORT[,HOST:PORT...] for the group protocol: FindCoordinator goes to the first "
                               "that answers, each group's members then connect to the coordinator it names (with "
                               "several coordinator instances, give them all). Default: the first "
                               "--bootstrap-server address")
    simulate.add_argument("--bootstrap-server", default=env("KAFKA_BOOTSTRAP"),
                          help="Kafka cluster for admin: the topic is created there if missing (env KAFKA_BOOTSTRAP)")
    simulate.add_argument("--groups", type=int, default=10)
    simulate.add_argument("--members", type=int, default=3, help="members per group")
    simulate.add_argument("--topic", default="simulated", help="the topic every member subscribes to")
    simulate.add_argument("--partitions", type=int, default=12, help="partitions when the topic is created")
    simulate.add_argument("--group-prefix", default="sim", help="group ids are PREFIX-0000, PREFIX-0001, ...")
    simulate.add_argument("--assignor", choices=["range", "cooperative-sticky"], default="range")
    simulate.add_argument("--static", action="store_true", help="static members (group.instance.id)")
    simulate.add_argument("--session-timeout-ms", type=int, default=10_000)
    simulate.add_argument("--rebalance-timeout-ms", type=int, default=30_000)
    simulate.add_argument("--heartbeat-interval-ms", type=int, default=3_000)
    simulate.add_argument("--commit-interval-ms", type=int, default=5_000, help="0: no commits")
    simulate.add_argument("--duration", type=float, default=30.0, help="seconds of load (failures injected meanwhile)")
    simulate.add_argument("--settle-timeout", type=float, default=60.0,
                          help="seconds to wait afterwards for every member to be back and Stable")
    simulate.add_argument("--inject", action="append", default=[], metavar="KIND[:COUNT]@SECONDS",
                          help="a scheduled failure, e.g. hang:3@5 (repeatable); KIND: crash (connection dropped, "
                               "no LeaveGroup), hang (connection kept, heartbeats stop), slow (next rejoin waits "
                               "half the rebalance timeout), leave (LeaveGroup, back as a new member), "
                               "static-restart (static members: back with the same instance id)")
    simulate.add_argument("--failure-rate", type=float, default=0.0, help="random failures per minute")
    simulate.add_argument("--failure-kinds", default="crash,hang", help="kinds drawn by --failure-rate")
    simulate.add_argument("--downtime-ms", type=int, default=None,
                          help="how long a crashed or hung member stays away (default: session timeout + 3000)")
    simulate.add_argument("--seed", type=int, default=None, help="seed for random failures and victims")
    simulate.add_argument("--event-topic", default="",
                          help="our coordinator's event topic: exact expiry times for detection lateness")
    simulate.add_argument("--no-leave", action="store_true", help="do not send LeaveGroup at the end")
    simulate.add_argument("--real", type=int, default=0, metavar="N",
                          help="also N real consumers (confluent-kafka and aiokafka, alternating) in group "
                               "PREFIX-real reading the topic through the coordinator's relay, and a real producer "
                               "writing a trickle of records to it")
    simulate.add_argument("--command-config", metavar="FILE", default=None,
                          help="TLS and SASL of every client of the simulation (members, topic admin, event reader, "
                               "real clients), a Kafka client properties file, e.g. the one `coordinator demo "
                               "--secure` prints (docs/security.md)")
    simulate.add_argument("--json", action="store_true", help="print the summary as one JSON line (status to stderr)")
    simulate.add_argument("--check", action="store_true",
                          help="exit 1 unless every surviving member is Stable, every crash/hang was detected "
                               "exactly once and no unexpected error code was seen")
    simulate.set_defaults(run=_run_simulate)


async def _run_simulate(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console

    from coordinator.loadgen import ScheduledFailure, SimOptions, Simulation
    from coordinator.loadgen.display import LiveStatus, summary_table

    try:
        schedule = tuple(ScheduledFailure.parse(text) for text in args.inject)
    except ValueError as exc:
        raise SystemExit(f"coordinator simulate: --inject: {exc}")
    coordinators = args.coordinator or ([host_port(args.bootstrap_server.split(",")[0])] if args.bootstrap_server
                                        else None)
    if not coordinators:
        raise SystemExit("coordinator simulate: give --coordinator HOST:PORT and/or --bootstrap-server")
    options = SimOptions(
        coordinator=coordinators[0], more_coordinators=tuple(coordinators[1:]),
        bootstrap_server=args.bootstrap_server, groups=args.groups, members=args.members,
        topic=args.topic, partitions=args.partitions, group_prefix=args.group_prefix, assignor=args.assignor,
        static=args.static, session_ms=args.session_timeout_ms, rebalance_ms=args.rebalance_timeout_ms,
        heartbeat_ms=args.heartbeat_interval_ms, commit_interval_ms=args.commit_interval_ms,
        duration_s=args.duration, settle_timeout_s=args.settle_timeout, schedule=schedule,
        failure_rate_per_min=args.failure_rate, failure_kinds=tuple(args.failure_kinds.split(",")),
        downtime_ms=args.downtime_ms, seed=args.seed, event_topic=args.event_topic or None,
        leave_on_exit=not args.no_leave, real=args.real, security=_security(args.command_config))
    console = Console(stderr=args.json)
    simulation = Simulation(options)
    stop = stop_on_signals()
    with LiveStatus(console) as live:
        running = asyncio.ensure_future(simulation.run(live.update))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not running.done():  # Ctrl-C: stop the members (they leave), no summary
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            stopping.cancel()
            return 130
        stopping.cancel()
        summary = running.result()
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        console.print(summary_table(summary))
    return 0 if summary["ok"] or not args.check else 1


def _security(path: str | None) -> Any:
    """--command-config read and checked now: a wrong setting is one line naming its key."""
    if path is None:
        return None
    from coordinator.security.client_config import ClientConfigError, load_command_config
    from coordinator.security.clusters import ClusterSecurity

    try:
        return ClusterSecurity.of(load_command_config(path))
    except ClientConfigError as exc:
        raise SystemExit(f"coordinator simulate: --command-config {path}: {exc}")


def _host_ports(text: str) -> list[tuple[str, int]]:
    return [host_port(part.strip()) for part in text.split(",") if part.strip()]

