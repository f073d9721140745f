"""`coordinator kafka`: the embedded Apache Kafka broker (or a KRaft cluster), until interrupted."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from coordinator.commands import stop_on_signals


def add_parser(commands: Any) -> None:
    kafka = commands.add_parser("kafka", help="run the embedded Apache Kafka broker until interrupted")
    kafka.add_argument("--data-dir", default=os.environ.get("COORDINATOR_KAFKA_DATA_DIR"),
                       help="broker data directory (default: a temporary one, removed on exit); it keeps the "
                            "ports chosen on first start, so a restart comes back at the same address")
    kafka.add_argument("--brokers", type=int, default=1,
                       help="number of brokers: 1 (default) or a KRaft cluster of N combined broker+controller nodes")
    kafka.add_argument("--secure", action="store_true",
                       help="also SASL_SSL and SSL listeners (a test CA in the data dir, SCRAM and PLAIN users); "
                            "prints client properties files for --command-config (docs/security.md)")
    kafka.set_defaults(run=_run_kafka)


async def _run_kafka(args: argparse.Namespace) -> int:
    from coordinator.embedded import (
        BrokerStartError, EmbeddedKafka, EmbeddedKafkaCluster, JarProvisioningError, kafka_version,
    )

    if args.brokers < 1:
        raise SystemExit("--brokers must be at least 1")
    data_dir, secure = _secure_kafka(args)
    stop = stop_on_signals()  # before the start: a Ctrl-C while the JVM starts stops it once it is up, not lost
    try:
        kafka = (EmbeddedKafka(data_dir, secure=secure) if args.brokers == 1
                 else EmbeddedKafkaCluster(args.brokers, data_dir))
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
        if secure is not None:
            _print_secure_kafka(kafka, secure)
        await stop.wait()
    finally:
        await kafka.stop()
        if args.data_dir is None:
            kafka.remove_data()
            if secure is not None:  # its temporary data dir was made here
                import shutil

                shutil.rmtree(data_dir, ignore_errors=True)
    return 0


def _secure_kafka(args: argparse.Namespace) -> tuple[Any, Any]:
    """(data dir, secured listeners or None) of `coordinator kafka [--secure]`."""
    if not args.secure:
        return args.data_dir, None
    import tempfile
    from pathlib import Path

    if args.brokers != 1:
        raise SystemExit("coordinator kafka: --secure runs one broker (--brokers 1)")
    try:
        from coordinator.embedded.secured import secure_listeners_in
    except ImportError as exc:
        raise SystemExit(f"coordinator kafka --secure: {exc}")
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="embedded-kafka-")
    try:
        return data_dir, secure_listeners_in(Path(data_dir))
    except ImportError:
        raise SystemExit("coordinator kafka --secure: its test CA is made with the `cryptography` package: "
                         "pip install '.[secure]' (scripts/setup.sh installs it)")


def _print_secure_kafka(kafka: Any, secure: Any) -> None:
    from coordinator.embedded.secured import write_client_properties

    files = write_client_properties(secure)
    users = ", ".join(f"{name}/{password}" for name, password in secure.users.items())
    print(f"secured listeners: SASL_SSL {kafka.sasl_ssl_bootstrap} (PLAIN, SCRAM-SHA-256/512, unsecured "
          f"OAUTHBEARER; users {users}), SSL {kafka.ssl_bootstrap} (client certificate required); CA "
          f"{secure.certificates.ca}", flush=True)
    print(f"client settings: {files['SASL_SSL']} and {files['SSL']}, e.g. coordinator serve --bootstrap-server "
          f"{kafka.sasl_ssl_bootstrap} --command-config {files['SASL_SSL']}", flush=True)

