"""`coordinator` command line: one sub-command per job."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )


async def _wait_for_interrupt() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _run_kafka(args: argparse.Namespace) -> int:
    from coordinator.embedded import EmbeddedKafka, kafka_version

    broker = EmbeddedKafka(args.data_dir)
    await broker.start()
    try:
        print(f"Apache Kafka {kafka_version()} running; bootstrap={broker.bootstrap} data_dir={broker.data_dir}",
              flush=True)
        print(broker.bootstrap, flush=True)
        await _wait_for_interrupt()
    finally:
        await broker.stop()
        if args.data_dir is None:
            broker.remove_data()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coordinator", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("COORDINATOR_LOG_LEVEL", "INFO"))
    commands = parser.add_subparsers(dest="command", required=True)

    kafka = commands.add_parser("kafka", help="run the embedded Apache Kafka broker until interrupted")
    kafka.add_argument("--data-dir", default=os.environ.get("COORDINATOR_KAFKA_DATA_DIR"),
                       help="broker data directory (default: a temporary one, removed on exit)")
    kafka.set_defaults(run=_run_kafka)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args.log_level)
    return asyncio.run(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
