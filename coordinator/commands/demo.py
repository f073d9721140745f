"""`coordinator demo`: Kafka, Jaeger, the coordinator and simulated consumers with failures, in one command."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from coordinator.commands import stop_on_signals
from coordinator.commands.serve import _one_line, _service_options


def add_parser(commands: Any) -> None:
    from coordinator.state_dir import default_state_dir

    env = os.environ.get
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
    demo.add_argument("--secure", action="store_true",
                      help="secured end to end: the embedded broker with SASL_SSL (SCRAM users, a test CA) and "
                           "Kafka's StandardAuthorizer, the coordinator listening with SASL_SSL, the consumers "
                           "authenticated and allowed by ACLs (docs/security.md, \"The secured demo\")")
    demo.set_defaults(run=_run_demo, serve_args=None)  # the service's flags, parsed by `serve`: cli.main sets them


async def _run_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from coordinator.demo import DemoOptions, run_demo

    if args.secure:
        _check_secure(args.serve_args)
    options = DemoOptions(service=_service_options(args.serve_args), state_dir=Path(args.state_dir),
                          consumers=args.consumers, failure_rate_per_min=args.failure_rate,
                          duration_s=args.duration, jaeger=not args.no_jaeger, real_consumers=args.real_consumers,
                          secure=args.secure, startup_log=tuple(getattr(args, "startup_log", ())))
    stop = stop_on_signals()
    try:
        return await run_demo(options, stop)
    except Exception as exc:
        print(f"coordinator demo: could not start: {_one_line(exc, options.service.bootstrap)}", file=sys.stderr,
              flush=True)
        return 1


def _check_secure(serve_args: argparse.Namespace) -> None:
    """--secure brings its own secured broker and sets the coordinator's security itself."""
    given = [flag for flag, value in (("--bootstrap-server", serve_args.bootstrap_server),
                                      ("--command-config", serve_args.command_config),
                                      ("--no-relay", serve_args.no_relay)) if value]
    if serve_args.listen.protocol != "PLAINTEXT":
        given.append(f"--listen {serve_args.listen}")
    if given:
        raise SystemExit(f"coordinator demo --secure: runs its own secured broker and secures the coordinator "
                         f"itself (SASL through the relay): drop {', '.join(given)} (for your own secured cluster: "
                         f"--bootstrap-server with --command-config and --listen SASL_SSL://..., docs/security.md)")
