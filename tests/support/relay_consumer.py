"""A stock Kafka consumer in its own process, for the relay tests.

`python -m tests.support.relay_consumer --kind confluent|aiokafka [--protocol classic|consumer] ...` subscribes,
and after every batch it consumes commits synchronously and prints one JSON line: {"event": "consumed",
"records": [[partition, offset, value], ...], "committed": bool}. Assignment changes print {"event":
"assigned", "partitions": [...]}. SIGTERM closes the consumer cleanly (LeaveGroup) and prints {"event":
"closed"}; SIGKILL is the crash the tests want.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
from typing import Any


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def run_confluent(args: argparse.Namespace, stop: threading.Event) -> None:
    from confluent_kafka import Consumer, KafkaException

    owned: set[int] = set()
    # KIP-848's protocol hands partitions out incrementally, like the cooperative classic assignor
    cooperative = args.assignor == "cooperative-sticky" or args.protocol == "consumer"

    def on_assign(consumer: Any, partitions: list[Any]) -> None:
        owned.update(tp.partition for tp in partitions)
        if cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        emit("assigned", partitions=sorted(owned))

    def on_revoke(consumer: Any, partitions: list[Any]) -> None:
        owned.difference_update(tp.partition for tp in partitions)
        if cooperative:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()
        emit("assigned", partitions=sorted(owned))

    config = {
        "bootstrap.servers": args.bootstrap, "group.id": args.group, "client.id": args.name,
        "auto.offset.reset": "earliest", "enable.auto.commit": False, "topic.metadata.refresh.interval.ms": 2_000,
        **dict(setting.split("=", 1) for setting in args.setting),
    }
    if args.protocol == "consumer":  # the coordinator decides the assignor, timeouts and heartbeat interval
        config.update({"group.protocol": "consumer", "group.remote.assignor": args.assignor})
    else:
        config.update({"partition.assignment.strategy": args.assignor, "session.timeout.ms": args.session_ms,
                       "heartbeat.interval.ms": max(args.session_ms // 6, 100)})
    consumer = Consumer(config)
    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    try:
        while not stop.is_set():
            messages = consumer.consume(500, timeout=0.2)
            records = [[m.partition(), m.offset(), m.value().decode()] for m in messages if m.error() is None]
            if not records:
                continue
            try:
                consumer.commit(asynchronous=False)
                committed = True
            except KafkaException:
                committed = False  # a rebalance took the partitions: they will be consumed again elsewhere
            emit("consumed", records=records, committed=committed)
    finally:
        consumer.close()  # LeaveGroup
        emit("closed")


def aiokafka_security(settings: dict[str, str]) -> dict[str, Any]:
    """The --setting names (librdkafka's) that aiokafka takes, in its own terms."""
    from aiokafka.helpers import create_ssl_context

    unknown = set(settings) - {"security.protocol", "sasl.mechanism", "sasl.username", "sasl.password",
                               "ssl.ca.location"}
    if unknown:
        raise SystemExit(f"aiokafka consumer: settings {sorted(unknown)} are not translated")
    options: dict[str, Any] = {}
    if "security.protocol" in settings:
        options["security_protocol"] = settings["security.protocol"].upper()
    if "sasl.mechanism" in settings:
        options.update(sasl_mechanism=settings["sasl.mechanism"], sasl_plain_username=settings.get("sasl.username"),
                       sasl_plain_password=settings.get("sasl.password"))
    if "ssl.ca.location" in settings:
        options["ssl_context"] = create_ssl_context(cafile=settings["ssl.ca.location"])
    return options


async def run_aiokafka(args: argparse.Namespace, stop: asyncio.Event) -> None:
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.errors import CommitFailedError, KafkaError
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    assignors = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked: Any) -> None:
            emit("assigned", partitions=[])

        async def on_partitions_assigned(self, assigned: Any) -> None:
            emit("assigned", partitions=sorted(tp.partition for tp in assigned))

    consumer = AIOKafkaConsumer(
        bootstrap_servers=args.bootstrap, group_id=args.group, client_id=args.name,
        auto_offset_reset="earliest", enable_auto_commit=False, session_timeout_ms=args.session_ms,
        heartbeat_interval_ms=max(args.session_ms // 6, 100), metadata_max_age_ms=2_000,
        partition_assignment_strategy=(assignors[args.assignor],),
        **aiokafka_security(dict(setting.split("=", 1) for setting in args.setting)),
    )
    consumer.subscribe([args.topic], listener=Listener())
    await consumer.start()
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200, max_records=500)
            records = [[m.partition, m.offset, m.value.decode()] for batch in batches.values() for m in batch]
            if not records:
                continue
            try:
                await consumer.commit()
                committed = True
            except (CommitFailedError, KafkaError):
                committed = False
            emit("consumed", records=records, committed=committed)
    finally:
        await consumer.stop()  # LeaveGroup
        emit("closed")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=["confluent", "aiokafka"], required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--assignor", default="range")
    parser.add_argument("--session-ms", type=int, default=6_000)
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a client setting by librdkafka's name (e.g. security.protocol=ssl); aiokafka takes "
                             "the security ones")
    parser.add_argument("--protocol", choices=["classic", "consumer"], default="classic")
    args = parser.parse_args()
    if args.kind == "confluent":
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        run_confluent(args, stop)
        return

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await run_aiokafka(args, stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
    sys.exit(0)
