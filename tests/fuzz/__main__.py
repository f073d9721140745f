"""Mutation fuzzer for Kafka listeners: mutated requests over many short connections, a control group
heartbeating throughout.

  python -m tests.fuzz [--frames 1000000] [--seed 13] [--target HOST:PORT] [--corpus served|KEY:MIN-MAX,...|module:attr]

Without --target it starts our coordinator (tests/fuzz/service.py: real server and GroupRuntime, in-memory
store) as a subprocess, samples its RSS at every wave and counts tracebacks and ERROR lines in its log. With
--target it fuzzes any listener (e.g. the relay's), the control group heartbeating at --control (default: the
target; --no-control for a listener that serves no groups). Prints a JSON line per wave and a summary; exits
1 when the control member saw an error, the service died, hung or logged a traceback/ERROR.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from tests.fuzz.runner import FuzzConfig, FuzzReport, ServiceProcess, parse_corpus, run_fuzz


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--frames", type=int, default=1_000_000, help="frames to send in total")
    parser.add_argument("--seed", type=int, default=13, help="the same seed sends the same bytes")
    parser.add_argument("--target", type=_address, help="HOST:PORT to fuzz (default: start our coordinator)")
    parser.add_argument("--control", type=_address, help="HOST:PORT for the control group (default: target)")
    parser.add_argument("--no-control", action="store_true", help="no control group (listener serves no groups)")
    parser.add_argument("--corpus", default="served", help="API version ranges (see parse_corpus)")
    parser.add_argument("--concurrency", type=int, default=16, help="connections open at once")
    parser.add_argument("--max-batch", type=int, default=6, help="frames per connection, at most")
    parser.add_argument("--waves", type=int, default=10, help="progress/memory samples over the run")
    parser.add_argument("--memory-report", action="store_true",
                        help="our service logs RSS, allocated blocks and object counts at every wave (its log)")
    parser.add_argument("--trace-allocations", action="store_true",
                        help="--memory-report plus tracemalloc's growing allocation sites (several times slower)")
    return parser.parse_args(argv)


async def fuzz(args: argparse.Namespace, service: ServiceProcess | None) -> FuzzReport:
    async def on_wave(index: int, report: FuzzReport) -> dict:
        sample = {"rss_kb": service.rss_kb()} if service is not None and service.alive else {}
        if sample and (args.memory_report or args.trace_allocations):
            service.process.send_signal(signal.SIGUSR1)
        print(json.dumps({"wave": index, "frames": report.frames, "connections": report.connections, **sample}),
              flush=True)
        return sample

    config = FuzzConfig(target=args.target or ("127.0.0.1", service.port), frames=args.frames,  # type: ignore
                        seed=args.seed, corpus=parse_corpus(args.corpus), concurrency=args.concurrency,
                        max_batch=args.max_batch, control=() if args.no_control else args.control,
                        waves=args.waves, on_wave=on_wave)
    return await run_fuzz(config)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.target is not None:
        report = asyncio.run(fuzz(args, None))
        summary = {"target": f"{args.target[0]}:{args.target[1]}", **report.summary()}
        failed = bool(report.control_errors or report.hangs)
    else:
        options = ["--memory-report"] * args.memory_report + ["--trace-allocations"] * args.trace_allocations
        with ServiceProcess(*options) as service:
            rss_start_kb = service.rss_kb()
            report = asyncio.run(fuzz(args, service))
            alive = service.alive
            rss_end_kb = service.rss_kb() if alive else None
        findings = service.findings()
        summary = {"target": "tests.fuzz.service", "service_alive": alive, "rss_start_kb": rss_start_kb,
                   "rss_end_kb": rss_end_kb, **findings, "log": str(service.log_path), **report.summary()}
        failed = bool(report.control_errors or report.hangs or not alive or findings["tracebacks"]
                      or findings["error_lines"])
    summary["seed"] = args.seed
    print(json.dumps(summary), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
