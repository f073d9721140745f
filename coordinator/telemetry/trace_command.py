"""`coordinator trace`: rebalance traces from Jaeger's query API, drawn in the terminal.

Named after what it reads: each rebalance is one trace, and the trace id on the log lines (`trace_id=`), the event
topic's records and the demo's event lines is what it takes as its argument.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from coordinator.telemetry.trace_render import render_list, render_rebalance, to_text
from coordinator.telemetry.trace_view import (
    JaegerQuery, Rebalance, TraceSourceError, default_jaeger_url, default_saved_traces, load_saved,
)

FOLLOW_INTERVAL_S = 2.0
FOLLOW_WINDOW_US = 10 * 60 * 1_000_000


def add_trace_command(commands: Any) -> None:
    trace = commands.add_parser(
        "trace", help="rebalance traces from Jaeger, drawn in the terminal",
        description="Reads rebalance traces from Jaeger's query API (the Jaeger `coordinator jaeger` or the demo "
                    "runs, or any Jaeger holding the coordinator's spans) and draws each one: why it happened, the "
                    "span waterfall (join and sync phases, each member's JoinGroup/SyncGroup wait, the state-topic "
                    "write) and the events, `member failed` with Kafka's line. Without TRACE_ID: the latest "
                    "rebalances (--last), of one group with --group; --follow draws new ones as they end.")
    trace.add_argument("trace_id", nargs="?", metavar="TRACE_ID",
                       help="one trace: the 32 hex digits after trace_id= on a log line, or its first digits "
                            "as the demo's event lines show them")
    trace.add_argument("--jaeger-url", default=None,
                       help="Jaeger's query URL, e.g. http://127.0.0.1:16686 (env COORDINATOR_JAEGER_URL; default: "
                            "the Jaeger of a running `coordinator demo`, else the traces the last demo saved)")
    trace.add_argument("--file", type=Path, default=None,
                       help="read traces saved as Jaeger's /api/traces JSON instead (the demo saves its traces "
                            "there when it stops)")
    trace.add_argument("--group", default=None, help="only this consumer group's rebalances")
    trace.add_argument("--last", type=int, default=3, metavar="N", help="how many of the latest rebalances")
    trace.add_argument("--list", action="store_true", help="one line per rebalance instead of the waterfall")
    trace.add_argument("--follow", action="store_true", help="keep drawing rebalances as they end (Ctrl-C stops)")
    trace.add_argument("--service", default=os.environ.get("OTEL_SERVICE_NAME") or "coordinator",
                       help="the coordinator's service name in Jaeger")
    trace.add_argument("--lookback", default="1h", help="how far back to search, as Jaeger takes it (1h, 30m, 2d)")
    trace.add_argument("--width", type=int, default=None, help="columns (default: the terminal's, or COLUMNS)")
    trace.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    trace.set_defaults(run=run_trace)


async def run_trace(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    width = args.width or shutil.get_terminal_size((100, 24)).columns
    color = args.color == "always" or (args.color == "auto" and out.isatty() and "NO_COLOR" not in os.environ)
    if args.last < 1:
        raise SystemExit("coordinator trace: --last must be at least 1")

    def show(rebalances: list[Rebalance]) -> None:
        if args.list:
            print(to_text(render_list(rebalances, width), color), file=out, flush=True)
            return
        for rebalance in rebalances:
            print(to_text(render_rebalance(rebalance, width), color) + "\n", file=out, flush=True)

    try:
        if args.file is None and args.jaeger_url is None and default_jaeger_url() is None:
            args.file = default_saved_traces()  # no Jaeger to ask: the last demo's traces, if it saved some
            if args.file is not None:
                print(f"(no Jaeger running: the traces the last demo saved in {args.file})", file=sys.stderr)
        if args.file is not None:
            found = [r for r in load_saved(args.file) if _wanted(r, args)]
            if args.follow:
                raise TraceSourceError("--follow needs a running Jaeger (--jaeger-url), not a saved file")
            if args.trace_id and not found:
                raise TraceSourceError(f"{args.file} has no rebalance trace {args.trace_id}")
            show(found if args.trace_id else found[-args.last:])
            return 0 if found else _nothing(args, out)
        url = args.jaeger_url or default_jaeger_url()
        if url is None:
            raise TraceSourceError("where is Jaeger? give its query URL with --jaeger-url (or COORDINATOR_JAEGER_URL)"
                                   "; `coordinator jaeger` and `coordinator demo` print it. A stopped demo's traces: "
                                   "--file <state dir>/traces.json")
        query = JaegerQuery(url, service=args.service)
        if args.trace_id:
            show([await asyncio.to_thread(query.by_id, args.trace_id)])
            return 0
        latest = await asyncio.to_thread(query.recent, args.last, args.group, args.lookback)
        show(latest)
        if not args.follow:
            return 0 if latest else _nothing(args, out)
        if not latest:
            _nothing(args, out)
        return await _follow(query, args, latest, show)
    except TraceSourceError as exc:
        print(f"coordinator trace: {exc}", file=sys.stderr, flush=True)
        return 1


def _wanted(rebalance: Rebalance, args: argparse.Namespace) -> bool:
    if args.trace_id and not rebalance.trace_id.startswith(args.trace_id.strip().lower()):  # a prefix will do
        return False
    return args.group is None or rebalance.group == args.group


def _nothing(args: argparse.Namespace, out: TextIO) -> int:
    where = f" of group {args.group}" if args.group else ""
    print(f"no rebalance traces{where} in the last {args.lookback} (service {args.service})", file=out, flush=True)
    return 0


async def _follow(query: JaegerQuery, args: argparse.Namespace, shown: list[Rebalance], show: Any) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    seen = {r.trace_id for r in shown}
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), FOLLOW_INTERVAL_S)
            break
        except asyncio.TimeoutError:
            pass
        try:
            # a rebalance reaches Jaeger when its root span ends, up to a rebalance timeout after it started
            since = time.time_ns() // 1000 - FOLLOW_WINDOW_US
            found = await asyncio.to_thread(query.recent, 200, args.group, args.lookback, since)
        except TraceSourceError as exc:  # Jaeger restarting, or gone with the demo: say so and keep trying
            print(f"coordinator trace: {exc}", file=sys.stderr, flush=True)
            continue
        new = [r for r in found if r.trace_id not in seen]
        if new:
            seen.update(r.trace_id for r in new)
            show(new)
    return 0
