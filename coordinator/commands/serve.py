"""`coordinator serve`: the group coordinator service, its options and how it starts."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from coordinator.commands import host_port, stop_on_signals

if TYPE_CHECKING:
    from coordinator.app import ServiceOptions


def add_parser(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run the group coordinator (with an embedded Kafka if no cluster)")
    env = os.environ.get
    serve.add_argument("--listen", type=_listener, default=env("COORDINATOR_LISTEN", "127.0.0.1:9192"),
                       help="[PROTOCOL://]HOST:PORT to accept Kafka clients on, Kafka's listener syntax: SSL://... "
                            "for TLS (see --config ssl.*), SASL_SSL:// or SASL_PLAINTEXT:// for SASL passed through "
                            "to the cluster, a bare HOST:PORT is PLAINTEXT (env COORDINATOR_LISTEN)")
    serve.add_argument("--advertised-listener", type=host_port, default=env("COORDINATOR_ADVERTISED_LISTENER"),
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
    secured = serve.add_argument_group(
        "a secured cluster", "How the coordinator's clients (state, events, admin, instances, the relay's own "
        "connections) reach a cluster that requires TLS or SASL: see docs/security.md")
    secured.add_argument("--command-config", metavar="FILE", default=env("COORDINATOR_COMMAND_CONFIG"),
                         help="a Kafka client properties file, as Kafka's tools take it: security.protocol, "
                              "sasl.mechanism, sasl.jaas.config (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER), "
                              "ssl.truststore.location with ssl.truststore.type=PEM, ssl.keystore.* (PEM); "
                              "librdkafka's names too (env COORDINATOR_COMMAND_CONFIG)")
    secured.add_argument("--config-file", metavar="FILE", default=env("COORDINATOR_CONFIG_FILE"),
                         help="broker-style properties, as --config NAME=VALUE lines (which win): the "
                              "coordinator's settings and our listeners' TLS with Kafka's names, ssl.keystore."
                              "location (ssl.keystore.type=PEM: key and chain in one file), ssl.key.password, "
                              "ssl.truststore.location, ssl.client.auth=none|requested|required, "
                              "ssl.enabled.protocols (env COORDINATOR_CONFIG_FILE)")
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
    serve.add_argument("--state-writer", choices=["librdkafka", "native"],
                       default=env("COORDINATOR_STATE_WRITER", "librdkafka"),
                       help="the client that runs the state writes' transactions: librdkafka (default; "
                            "confluent-kafka's transactional producer, on threads of its own) or native (our own "
                            "asyncio Kafka client on the coordinator's loop: retries Kafka's CONCURRENT_TRANSACTIONS "
                            "after 1 ms instead of librdkafka's fixed 20 ms, adds a partition ahead of a write "
                            "without a marker record). Same transactional ids either way (env "
                            "COORDINATOR_STATE_WRITER)")
    serve.add_argument("--markers-settle-ms", type=float, metavar="MS",
                       default=float(env("COORDINATOR_MARKERS_SETTLE_MS", "0")),
                       help="librdkafka's state writer: a transaction that would begin within this of the last "
                            "commit's outcome is held until then (writes queued meanwhile join it), so that Kafka "
                            "has written the last one's markers (else it refuses the next AddPartitionsToTxn, "
                            "CONCURRENT_TRANSACTIONS, and librdkafka asks again only 20 ms later); 0: never held "
                            "(env COORDINATOR_MARKERS_SETTLE_MS; default 0)")
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
                            "or offsets.topic.num.partitions=10, or our listeners' ssl.* (repeatable)")
    serve.add_argument("--metrics-listen", type=host_port, default=env("COORDINATOR_METRICS_LISTEN"),
                       help="HOST:PORT of a Prometheus scrape endpoint (/metrics; env COORDINATOR_METRICS_LISTEN). "
                            "Traces and OTLP metrics follow the OTEL_* variables: see docs/tracing.md")
    serve.add_argument("--compiled", nargs="?", const="default", metavar="DIR", default=env("COORDINATOR_COMPILED"),
                       help="run the modules mypyc compiled into DIR (without --compiled or --pure: this source "
                            "tree's build/compiled when it exists; scripts/setup.sh makes it, or python "
                            "scripts/build_compiled.py), each only while the sources it was compiled against are "
                            "unchanged, else its pure source: one log line at start says which run compiled and why "
                            "others fell back (env COORDINATOR_COMPILED: 1, DIR, or 0 for --pure). Read before the "
                            "service's modules are imported (coordinator/cli.py)")
    serve.add_argument("--pure", action="store_true",
                       help="run every module from its source, even where a compiled build has it")
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


def _listener(text: str) -> Any:
    from coordinator.security.listeners import parse_listener

    try:
        return parse_listener(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))



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

    listen_host, listen_port = args.listen.host, args.listen.port
    advertised_host, advertised_port = args.advertised_listener or (None, None)
    instance_id = _instance_id(args)
    node_id = args.node_id if args.node_id is not None else (
        default_node_id(instance_id) if instance_id is not None else 0 if args.no_relay else DEFAULT_NODE_ID)
    listener_tls, access, group_settings = _listener_settings(args)
    try:
        group = CoordinatorConfig.from_properties(group_settings)
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
                              listen_backlog=args.listen_backlog, ssl_context=listener_tls,
                              sasl_passthrough=args.listen.uses_sasl, access=access)
        relay = None if args.no_relay else RelayConfig(
            base_port=args.relay_base_port, advertised_host=args.relay_advertised_host,
            buffer_memory_bytes=args.relay_buffer_memory, max_block_ms=args.relay_max_block_ms,
            sasl_passthrough=args.listen.uses_sasl)
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
        state_writer=args.state_writer,
        markers_settle_ms=args.markers_settle_ms,
        metrics_listen=args.metrics_listen,
        relay=relay,
        instance_id=instance_id,
        instances_group=args.instances_group,
        instance_session_timeout_ms=args.instance_session_timeout_ms,
        client_security=_client_security(args),
    )


def _listener_settings(args: argparse.Namespace) -> tuple[Any, Any, dict[str, str]]:
    """(TLS context of our listeners or None, who may do what on them, the coordinator's own settings) from
    --config-file, then --config (the command line wins): broker property names for all."""
    from coordinator.security.access import access_settings, split_access_settings
    from coordinator.security.client_config import ClientConfigError
    from coordinator.security.listeners import server_ssl_context, split_listener_settings
    from coordinator.security.properties import load_properties

    settings: dict[str, str] = {}
    if args.config_file is not None:
        try:
            settings.update(load_properties(args.config_file))
        except OSError as exc:
            raise SystemExit(f"coordinator serve: --config-file {args.config_file}: {exc.strerror or exc}")
    settings.update(dict(args.config))
    tls, rest = split_listener_settings(settings)
    access, rest = split_access_settings(rest)
    try:
        return server_ssl_context(args.listen, tls), access_settings(access, listener=args.listen.protocol), rest
    except ClientConfigError as exc:
        raise SystemExit(f"coordinator serve: --listen {args.listen}: {exc}")


def _client_security(args: argparse.Namespace) -> Any:
    """--command-config read and checked now: a wrong setting is one line naming its key."""
    from coordinator.security.client_config import ClientConfigError, load_command_config

    if args.listen.uses_sasl and (args.no_relay or args.command_config is None):
        raise SystemExit(f"coordinator serve: --listen {args.listen}: SASL on our listeners passes each client's "
                         f"exchange through to the cluster, so it needs the relay and a SASL cluster "
                         f"(--command-config with security.protocol=SASL_*)")
    if args.command_config is None:
        return None
    if args.bootstrap_server is None:
        raise SystemExit("coordinator serve: --command-config needs --bootstrap-server (the embedded Kafka broker "
                         "is PLAINTEXT)")
    try:
        return load_command_config(args.command_config)
    except ClientConfigError as exc:
        raise SystemExit(f"coordinator serve: --command-config {args.command_config}: {exc}")


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
    stop = stop_on_signals()
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
        # a fault of ours, not of the surroundings: the log keeps where it came from (one line on stderr still)
        traceback = exc if isinstance(exc, _FAULTS) else None
        logging.getLogger("coordinator").error("event=startup_failed error=%s", reason, exc_info=traceback)
        print(f"coordinator serve: could not start: {reason}", file=sys.stderr, flush=True)
        return 1
    return 0


# Exceptions that say the code is wrong, not the cluster, the port or the configuration
_FAULTS = (SystemError, AssertionError, TypeError, AttributeError, NameError, LookupError, ZeroDivisionError)


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

