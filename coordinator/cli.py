"""`coordinator` command line: one sub-command per job."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coordinator.app import ServiceOptions


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _run_kafka(args: argparse.Namespace) -> int:
    from coordinator.embedded import (
        BrokerStartError, EmbeddedKafka, EmbeddedKafkaCluster, JarProvisioningError, kafka_version,
    )

    if args.brokers < 1:
        raise SystemExit("--brokers must be at least 1")
    stop = _stop_on_signals()  # before the start: a Ctrl-C while the JVM starts stops it once it is up, not lost
    try:
        kafka = (EmbeddedKafka(args.data_dir) if args.brokers == 1
                 else EmbeddedKafkaCluster(args.brokers, args.data_dir))
        await kafka.start()
    except (BrokerStartError, JarProvisioningError) as exc:  # port taken, wrong data dir, no Java...: say why
        print(f"coordinator kafka: could not start: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        nodes = "" if not isinstance(kafka, EmbeddedKafkaCluster) else " nodes=" + ",".join(
            f"{node_id}@{address}" for node_id, address in kafka.addresses().items())
        print(f"Apache Kafka {kafka_version()} running; bootstrap={kafka.bootstrap}{nodes} data_dir={kafka.data_dir}",
              flush=True)
        print(kafka.bootstrap, flush=True)
        await stop.wait()
    finally:
        await kafka.stop()
        if args.data_dir is None:
            kafka.remove_data()
    return 0


async def _run_simulate(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console

    from coordinator.loadgen import ScheduledFailure, SimOptions, Simulation
    from coordinator.loadgen.display import LiveStatus, summary_table

    try:
        schedule = tuple(ScheduledFailure.parse(text) for text in args.inject)
    except ValueError as exc:
        raise SystemExit(f"coordinator simulate: --inject: {exc}")
    coordinators = args.coordinator or ([_host_port(args.bootstrap_server.split(",")[0])] if args.bootstrap_server
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
        leave_on_exit=not args.no_leave, real=args.real)
    console = Console(stderr=args.json)
    simulation = Simulation(options)
    stop = _stop_on_signals()
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


async def _run_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from coordinator.demo import DemoOptions, run_demo

    serve_args = build_parser().parse_args(["serve", *args.serve_args])
    options = DemoOptions(service=_service_options(serve_args), state_dir=Path(args.state_dir),
                          consumers=args.consumers, failure_rate_per_min=args.failure_rate,
                          duration_s=args.duration, jaeger=not args.no_jaeger, real_consumers=args.real_consumers)
    stop = _stop_on_signals()
    try:
        return await run_demo(options, stop)
    except Exception as exc:
        print(f"coordinator demo: could not start: {_one_line(exc, options.service.bootstrap)}", file=sys.stderr,
              flush=True)
        return 1


async def _run_jaeger(args: argparse.Namespace) -> int:
    from coordinator.embedded.jaeger import EmbeddedJaeger, JaegerBuildError, JaegerStartError, find_jaeger

    try:
        binary = await asyncio.to_thread(find_jaeger, args.jaeger_bin)
        print(f"jaeger: {binary.origin}", flush=True)
        if not binary.has_ui and not args.ui_assets:
            print("jaeger: the module build serves a placeholder instead of the web UI; its HTTP API works. For the "
                  "UI use an official jaeger binary (--jaeger-bin or PATH) or a built jaeger-ui (--ui-assets DIR)",
                  flush=True)
        jaeger = EmbeddedJaeger(binary.path, ui_assets=args.ui_assets, max_traces=args.max_traces)
        jaeger.start()  # on this thread: the child's die-with-parent signal is tied to the thread that forks it
    except (JaegerBuildError, JaegerStartError) as exc:
        print(f"coordinator jaeger: {exc}", file=sys.stderr, flush=True)
        return 1
    stop = _stop_on_signals()  # before the endpoints are printed: a signal right after them stops cleanly
    try:
        print(f"Jaeger running (pid {jaeger.pid}), in-memory storage\n"
              f"  UI and query API  {jaeger.query_url}  (e.g. {jaeger.query_url}/api/traces?service=coordinator)\n"
              f"  OTLP/HTTP         {jaeger.otlp_http_endpoint}\n"
              f"  OTLP/gRPC         {jaeger.otlp_grpc_endpoint}\n"
              f"send the coordinator's traces here (Jaeger takes traces only, not metrics):\n"
              f"  export OTEL_EXPORTER_OTLP_TRACES_ENDPOINT={jaeger.otlp_http_endpoint}/v1/traces", flush=True)
        await stop.wait()
    finally:
        await asyncio.to_thread(jaeger.stop)
    return 0


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _host_ports(text: str) -> list[tuple[str, int]]:
    return [_host_port(part.strip()) for part in text.split(",") if part.strip()]


def _kafka_property(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected name=value, got {text!r}")
    return name.strip(), value.strip()


def _service_options(args: argparse.Namespace) -> "ServiceOptions":
    from coordinator.app import ServiceOptions
    from coordinator.config import CoordinatorConfig
    from coordinator.server.config import ServerConfig

    from coordinator.cluster.identity import default_node_id
    from coordinator.relay import DEFAULT_NODE_ID, RelayConfig

    listen_host, listen_port = args.listen
    advertised_host, advertised_port = args.advertised_listener or (None, None)
    instance_id = _instance_id(args)
    node_id = args.node_id if args.node_id is not None else (
        default_node_id(instance_id) if instance_id is not None else 0 if args.no_relay else DEFAULT_NODE_ID)
    try:
        group = CoordinatorConfig.from_properties(dict(args.config))
    except KeyError as exc:
        raise SystemExit(f"unknown coordinator config {exc}; known: {sorted(CoordinatorConfig.kafka_names())}")
    except ValueError as exc:
        raise SystemExit(f"coordinator serve: bad --config: {exc}")
    if None not in (args.state_replication_factor, group.offsets_topic_replication_factor) and (
            args.state_replication_factor != group.offsets_topic_replication_factor):
        raise SystemExit("coordinator serve: --state-replication-factor and --config "
                         "offsets.topic.replication.factor disagree: give one")
    try:
        server = ServerConfig(listen_host=listen_host, listen_port=listen_port, advertised_host=advertised_host,
                              advertised_port=advertised_port, node_id=node_id,
                              listen_backlog=args.listen_backlog)
        relay = None if args.no_relay else RelayConfig(
            base_port=args.relay_base_port, advertised_host=args.relay_advertised_host,
            buffer_memory_bytes=args.relay_buffer_memory, max_block_ms=args.relay_max_block_ms)
    except ValueError as exc:
        raise SystemExit(f"coordinator serve: {exc}")
    _check_event_settings(args)
    return ServiceOptions(
        server=server,
        group=group,
        bootstrap=args.bootstrap_server,
        kafka_data_dir=args.kafka_data_dir,
        state_topic=args.state_topic,
        state_replication_factor=args.state_replication_factor,
        event_topic=args.event_topic or None,
        event_delivery_timeout_ms=args.event_delivery_timeout_ms,
        event_queue_max_messages=args.event_queue_max_messages,
        transactional_writes=args.write_mode == "transactional",
        metrics_listen=args.metrics_listen,
        relay=relay,
        instance_id=instance_id,
        instances_group=args.instances_group,
        instance_session_timeout_ms=args.instance_session_timeout_ms,
    )


def _check_event_settings(args: argparse.Namespace) -> None:
    """The event producer's settings, refused here with the flag's name rather than once Kafka is up."""
    from coordinator.storage.config import StorageConfig

    try:
        StorageConfig(bootstrap="", event_queue_max_messages=args.event_queue_max_messages)
    except ValueError as exc:
        raise SystemExit(f"coordinator serve: --event-queue-max-messages: {exc}")
    try:
        StorageConfig(bootstrap="", event_delivery_timeout_ms=args.event_delivery_timeout_ms)
    except ValueError as exc:
        raise SystemExit(f"coordinator serve: --event-delivery-timeout-ms: {exc}")


def _instance_id(args: argparse.Namespace) -> str | None:
    from coordinator.cluster.identity import validate_instance_id

    if args.instance_id is None:
        if args.instances_group is not None:
            raise SystemExit("coordinator serve: --instances-group needs --instance-id")
        return None
    if args.instance_session_timeout_ms < 1:
        raise SystemExit("coordinator serve: --instance-session-timeout-ms must be positive")
    try:
        return validate_instance_id(args.instance_id)
    except ValueError as exc:
        raise SystemExit(f"coordinator serve: --instance-id: {exc}")


async def _run_serve(args: argparse.Namespace) -> int:
    from coordinator.app import RunningService, run_until

    options = _service_options(args)
    stop = _stop_on_signals()
    started = False

    def ready(service: RunningService) -> None:
        nonlocal started
        started = True
        node = service.server.node
        print(f"coordinator listening on {node.host}:{node.port} (node {node.node_id}); "
              f"state in Kafka at {service.bootstrap}, topic {options.state_topic}", flush=True)
        if service.ownership is not None:
            print(f"instance {service.ownership.instance_id} in group {service.ownership.group_id}: Kafka assigns "
                  f"it its share of the {len(service.coordinator.shards)} state partitions", flush=True)
        relay = service.server.relay
        if relay is not None and relay.listeners is not None:
            ports = (", ".join(f"{node_id}→{port}" for node_id, port in sorted(relay.listeners.ports.items()))
                     or "none open yet (event=relay_listener_failed says why, e.g. a port taken; retried on every "
                        "Metadata answer from the cluster)")
            print(f"relaying to the cluster at {service.bootstrap}; broker listeners (node id→port): {ports}",
                  flush=True)

    try:
        await run_until(stop, options, ready)
    except Exception as exc:
        if started:
            raise
        # could not start (Kafka unreachable, state topic unusable, port taken, no Java...): say why, exit 1
        reason = _one_line(exc, options.bootstrap)
        if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:  # uvloop's message names no address
            ours = [f"--listen {options.server.listen_host}:{options.server.listen_port}"]
            if options.metrics_listen is not None:
                ours.append("--metrics-listen {}:{}".format(*options.metrics_listen))
            reason = (f"address already in use: {' or '.join(ours)} ({reason}); another coordinator's relay on "
                      f"this host may hold it (its broker listeners take its listen port + 1 + node id unless "
                      f"--relay-base-port says otherwise)")
        logging.getLogger("coordinator").error("event=startup_failed error=%s", reason)
        print(f"coordinator serve: could not start: {reason}", file=sys.stderr, flush=True)
        return 1
    return 0


def _one_line(exc: BaseException, bootstrap: str | None = None) -> str:
    """The reason a command could not start, on one line; a Kafka client's error names the cluster it tried."""
    kafka_error = exc.args[0] if type(exc).__name__ == "KafkaException" and exc.args else None
    if kafka_error is not None and hasattr(kafka_error, "str") and hasattr(kafka_error, "name"):
        where = f"Kafka at {bootstrap}" if bootstrap else "Kafka"
        if kafka_error.name() in ("_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_RESOLVE"):
            return (f"{where} did not answer ({kafka_error.str()}): is the address right (--bootstrap-server) "
                    f"and the cluster up?").replace("\n", " | ")
        return f"{where}: {kafka_error.name()}: {kafka_error.str()}".replace("\n", " | ")
    return f"{type(exc).__name__}: {exc}".replace("\n", " | ")


class _HelpFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default (the value the environment gave, if any), unless the text already
    names it or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (action.default in (None, False, [], "", argparse.SUPPRESS) or "default" in text
                or action.option_strings == []):
            return action.help
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coordinator", description=__doc__, formatter_class=_HelpFormatter)
    parser.add_argument("--log-level", default=os.environ.get("COORDINATOR_LOG_LEVEL", "INFO"),
                        help="DEBUG, INFO, WARNING or ERROR (env COORDINATOR_LOG_LEVEL)")
    parser.add_argument("--event-loop", choices=["auto", "asyncio", "uvloop"],
                        default=os.environ.get("COORDINATOR_EVENT_LOOP", "auto"),
                        help="auto: uvloop when installed, else asyncio (env COORDINATOR_EVENT_LOOP)")
    commands = parser.add_subparsers(dest="command", required=True)

    kafka = commands.add_parser("kafka", help="run the embedded Apache Kafka broker until interrupted")
    kafka.add_argument("--data-dir", default=os.environ.get("COORDINATOR_KAFKA_DATA_DIR"),
                       help="broker data directory (default: a temporary one, removed on exit); it keeps the "
                            "ports chosen on first start, so a restart comes back at the same address")
    kafka.add_argument("--brokers", type=int, default=1,
                       help="number of brokers: 1 (default) or a KRaft cluster of N combined broker+controller nodes")
    kafka.set_defaults(run=_run_kafka)

    jaeger = commands.add_parser(
        "jaeger", help="run a real Jaeger (v2 all-in-one, in-memory) on loopback until interrupted",
        description="Runs Jaeger v2 on free loopback ports (OTLP HTTP+gRPC in, query API and UI out) and prints "
                    "the OTEL_EXPORTER_OTLP_ENDPOINT to give the coordinator. Uses the jaeger binary you have "
                    "(--jaeger-bin, else PATH), else the project's module build (scripts/setup.sh), which has no UI.")
    jaeger.add_argument("--jaeger-bin", default=os.environ.get("COORDINATOR_JAEGER_BIN"),
                        help="a jaeger v2 binary (env COORDINATOR_JAEGER_BIN; default: `jaeger` on PATH, "
                             "else the module build)")
    jaeger.add_argument("--ui-assets", default=os.environ.get("COORDINATOR_JAEGER_UI_ASSETS"),
                        help="a built jaeger-ui directory to serve as the UI (env COORDINATOR_JAEGER_UI_ASSETS)")
    jaeger.add_argument("--max-traces", type=int, default=100_000, help="traces kept in memory")
    jaeger.set_defaults(run=_run_jaeger)

    serve = commands.add_parser("serve", help="run the group coordinator (with an embedded Kafka if no cluster)")
    env = os.environ.get
    serve.add_argument("--listen", type=_host_port, default=env("COORDINATOR_LISTEN", "127.0.0.1:9192"),
                       help="HOST:PORT to accept Kafka clients on (env COORDINATOR_LISTEN)")
    serve.add_argument("--advertised-listener", type=_host_port, default=env("COORDINATOR_ADVERTISED_LISTENER"),
                       help="HOST:PORT told to clients in Metadata/FindCoordinator (default: the listen address)")
    serve.add_argument("--listen-backlog", type=int, default=int(env("COORDINATOR_LISTEN_BACKLOG", "65535")),
                       help="connections the kernel queues before they are accepted (Kafka's "
                            "socket.listen.backlog.size; env COORDINATOR_LISTEN_BACKLOG); the kernel caps it at "
                            "net.core.somaxconn, see docs/operations.md")
    serve.add_argument("--node-id", type=int,
                       default=int(os.environ["COORDINATOR_NODE_ID"]) if env("COORDINATOR_NODE_ID") else None,
                       help="the coordinator's node id in Metadata/FindCoordinator (default 2000000000 with the "
                            "relay, so no broker has it; 0 with --no-relay; with --instance-id one derived from "
                            "the instance id, stable across restarts)")
    serve.add_argument("--bootstrap-server", default=env("KAFKA_BOOTSTRAP"),
                       help="the Kafka cluster holding the state topic (env KAFKA_BOOTSTRAP); "
                            "none: an embedded Apache Kafka broker is started")
    serve.add_argument("--kafka-data-dir", default=env("COORDINATOR_KAFKA_DATA_DIR"),
                       help="data dir of the embedded broker (default: temporary)")
    serve.add_argument("--state-topic", default=env("COORDINATOR_STATE_TOPIC", "__coordinator_state"))
    serve.add_argument("--state-replication-factor", type=int, default=None,
                       help="replication factor of the state topic (default: min(3, brokers); the same as "
                            "--config offsets.topic.replication.factor=N)")
    serve.add_argument("--event-topic", default=env("COORDINATOR_EVENT_TOPIC", "__coordinator_events"),
                       help="topic for group events ('' to disable)")
    serve.add_argument("--event-delivery-timeout-ms", type=int, metavar="MS",
                       default=int(env("COORDINATOR_EVENT_DELIVERY_TIMEOUT_MS", "30000")),
                       help="how long a group event may wait for the event topic before it is dropped and counted "
                            "as lost (librdkafka's message.timeout.ms): a Kafka outage shorter than this loses no "
                            "event; 0: no limit (default 30000; env COORDINATOR_EVENT_DELIVERY_TIMEOUT_MS)")
    serve.add_argument("--event-queue-max-messages", type=int, metavar="N",
                       default=int(env("COORDINATOR_EVENT_QUEUE_MAX_MESSAGES", "100000")),
                       help="group events held while the event topic is slow or away; beyond this the newest "
                            "are dropped, never waited for (default 100000; env COORDINATOR_EVENT_QUEUE_MAX_MESSAGES)")
    serve.add_argument("--write-mode", choices=["transactional", "idempotent"],
                       default=env("COORDINATOR_WRITE_MODE", "transactional"),
                       help="transactional (default): every state write all or nothing, and fenced by a newer "
                            "process on the same state topic; idempotent: faster under many concurrent commits, "
                            "but librdkafka may store a write in part (env COORDINATOR_WRITE_MODE)")
    serve.add_argument("--no-relay", action="store_true", default=env("COORDINATOR_NO_RELAY", "") == "1",
                       help="serve the group APIs only (no relay): clients must bootstrap to the cluster itself "
                            "(env COORDINATOR_NO_RELAY=1)")
    serve.add_argument("--relay-base-port", type=int,
                       default=(int(os.environ["COORDINATOR_RELAY_BASE_PORT"]) if env("COORDINATOR_RELAY_BASE_PORT")
                                else None),
                       help="broker listener port = BASE + broker node id (default: the listen port + 1) "
                            "(env COORDINATOR_RELAY_BASE_PORT)")
    serve.add_argument("--relay-advertised-host", default=env("COORDINATOR_RELAY_ADVERTISED_HOST"),
                       help="host clients are told for the broker listeners (default: the advertised host)")
    serve.add_argument("--relay-buffer-memory", type=int,
                       default=int(env("COORDINATOR_RELAY_BUFFER_MEMORY", str(134_217_728))),
                       help="bytes all relayed responses may hold together (like Kafka's buffer.memory; "
                            "default 128 MiB; must exceed the largest fetch response, fetch.max.bytes)")
    serve.add_argument("--relay-max-block-ms", type=int,
                       default=int(env("COORDINATOR_RELAY_MAX_BLOCK_MS", "60000")),
                       help="how long a response may wait for relay memory before its connection is closed "
                            "(like Kafka's max.block.ms)")
    serve.add_argument("--config", type=_kafka_property, action="append", default=[], metavar="NAME=VALUE",
                       help="a coordinator setting by its Kafka name, e.g. group.initial.rebalance.delay.ms=0 "
                            "or offsets.topic.num.partitions=10 (repeatable)")
    serve.add_argument("--metrics-listen", type=_host_port, default=env("COORDINATOR_METRICS_LISTEN"),
                       help="HOST:PORT of a Prometheus scrape endpoint (/metrics; env COORDINATOR_METRICS_LISTEN). "
                            "Traces and OTLP metrics follow the OTEL_* variables: see docs/tracing.md")
    instances = serve.add_argument_group(
        "several instances",
        "Run N `coordinator serve --instance-id ID` processes on one Kafka cluster and state topic (distinct ids and "
        "listen addresses; with the relay, distinct --relay-base-port on one host). Kafka decides which instance "
        "owns which state-topic partition: the instances form a consumer group of their own on the state topic "
        "(cooperative-sticky), an instance loads the partitions it is assigned, after fencing their previous owner, "
        "and any instance answers FindCoordinator with the owner of a group's partition. A cleanly stopped "
        "instance leaves the group and its partitions move at once; a crashed one after the session timeout. "
        "See docs/operations.md and docs/architecture.md (\"Several instances\").")
    instances.add_argument("--instance-id", metavar="ID", default=env("COORDINATOR_INSTANCE_ID"),
                           help="turns on multi-instance mode: this instance's id (1-200 of A-Z a-z 0-9 . _ -), "
                                "unique among the instances; logged, and shown to the others with our address "
                                "(env COORDINATOR_INSTANCE_ID). State writes are then always transactional, one "
                                "producer per owned partition (the fence; --write-mode does not apply). Without it "
                                "this instance owns every partition")
    instances.add_argument("--instances-group", metavar="GROUP", default=env("COORDINATOR_INSTANCES_GROUP"),
                           help="the instances' consumer group (default: <state topic>.coordinators; "
                                "env COORDINATOR_INSTANCES_GROUP)")
    instances.add_argument("--instance-session-timeout-ms", type=int, metavar="MS",
                           default=int(env("COORDINATOR_INSTANCE_SESSION_TIMEOUT_MS", "6000")),
                           help="how long an instance may go silent before Kafka gives its partitions to the "
                                "others (session.timeout.ms of the instances group; default 6000, the broker's "
                                "group.min.session.timeout.ms; env COORDINATOR_INSTANCE_SESSION_TIMEOUT_MS). An "
                                "instance paused for a third of it serves nothing until Kafka confirms it still owns "
                                "its partitions")
    serve.set_defaults(run=_run_serve)

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
    simulate.add_argument("--json", action="store_true", help="print the summary as one JSON line (status to stderr)")
    simulate.add_argument("--check", action="store_true",
                          help="exit 1 unless every surviving member is Stable, every crash/hang was detected "
                               "exactly once and no unexpected error code was seen")
    simulate.set_defaults(run=_run_simulate)

    from coordinator.demo import default_state_dir

    demo = commands.add_parser(
        "demo", help="the whole story: Kafka, Jaeger, the coordinator and simulated consumers with failures",
        description="Runs the embedded Apache Kafka (data kept in --state-dir) or your cluster (--bootstrap-server), "
                    "Jaeger when available, the coordinator, and a few simulated consumer groups with a failure "
                    "now and then; prints the addresses, then a live status line. Ctrl-C stops everything. Every "
                    "`coordinator serve` flag is accepted too (see `coordinator serve --help`).")
    demo.add_argument("--consumers", type=int, default=int(env("COORDINATOR_DEMO_CONSUMERS", "12")),
                      help="simulated consumers, in groups of 4 (0: the bare service)")
    demo.add_argument("--failure-rate", type=float, default=3.0, help="failures injected per minute")
    demo.add_argument("--real-consumers", type=int, default=2, metavar="N",
                      help="real consumers (confluent-kafka, aiokafka) beside the simulated ones, reading through "
                           "the relay (with --consumers 0 or --no-relay: none)")
    demo.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: Ctrl-C)")
    demo.add_argument("--state-dir", default=env("COORDINATOR_STATE_DIR", str(default_state_dir())),
                      help="where the embedded Kafka keeps its data between runs (env COORDINATOR_STATE_DIR)")
    demo.add_argument("--no-jaeger", action="store_true", help="do not start Jaeger")
    demo.set_defaults(run=_run_demo, serve_args=[])

    from coordinator.telemetry.trace_command import add_trace_command

    add_trace_command(commands)
    from analytics.cli import add_analyze_command  # imports pyspark only when `analyze` runs

    add_analyze_command(commands)
    for command in commands.choices.values():
        command.formatter_class = _HelpFormatter
        for action in command._actions:  # argparse prints nothing for an option without help: not even its default
            if action.help is None and action.default not in (None, False, [], "", argparse.SUPPRESS):
                action.help = "default: %(default)s"
    return parser


def _run(coro: Any, event_loop: str) -> int:
    """uvloop when asked for or, with "auto", when installed (the `speed` extra): ~20% more requests per core."""
    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                raise SystemExit("--event-loop uvloop: uvloop is not installed (pip install '.[speed]')")
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)


def _sub_command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[command]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "demo":  # said by the sub-command, whose usage lists its flags
        _sub_command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "demo":
        args.serve_args = unknown  # the service's own flags, parsed as `coordinator serve` parses them
    _configure_logging(args.log_level)
    return _run(args.run(args), args.event_loop)


if __name__ == "__main__":
    sys.exit(main())
