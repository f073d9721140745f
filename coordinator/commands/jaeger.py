"""`coordinator jaeger`: a real Jaeger (v2 all-in-one, in-memory) on loopback, until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from coordinator.commands import stop_on_signals


def add_parser(commands: Any) -> None:
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
    stop = stop_on_signals()  # before the endpoints are printed: a signal right after them stops cleanly
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

