"""CPU of an idle `coordinator serve`: no client, nothing written, only what runs by itself (the partitions' tails,
timers, the relay's metadata refreshes).

    python -m bench.idle_cpu [--seconds 60] [--settle-s 10] [--baseline-tree DIR]

One embedded broker; our server from this checkout and, with `--baseline-tree DIR` (a source tree, e.g. from
`git archive <commit> | tar -x -C DIR`), a second one from there, both started at once on their own state topics,
left `--settle-s` to finish loading, then measured over the same `--seconds`: CPU of every thread of each server
process (/proc/<pid>/task/*/schedstat; the broker's JVM is another process and not counted), as ms of CPU per
second, and after ÷ before. The load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from bench.coordinator import _server_cpu_ns, start_ours, stop_servers
from coordinator.embedded import EmbeddedKafka


async def main(args: argparse.Namespace) -> dict[str, Any]:
    broker = EmbeddedKafka()
    await broker.start()
    processes: list[subprocess.Popen] = []
    try:
        servers = {"after": await start_ours(broker.bootstrap)}
        if args.baseline_tree:
            servers["before"] = await start_ours(broker.bootstrap, "before", args.baseline_tree)
        processes = [process for process, _ in servers.values()]
        await asyncio.sleep(args.settle_s)  # loading done, the tails' first fetches sent
        load_before = os.getloadavg()[0]
        started = {name: _server_cpu_ns(server.pid) for name, (_, server) in servers.items()}
        began = time.perf_counter()
        await asyncio.sleep(args.seconds)
        elapsed = time.perf_counter() - began
        used = {name: _server_cpu_ns(server.pid) - started[name] for name, (_, server) in servers.items()}
    finally:
        await stop_servers(processes, broker)
    figures: dict[str, Any] = {f"{name}_cpu_ms_per_s": round(ns / 1e6 / elapsed, 2) for name, ns in used.items()}
    if "before" in used and used["before"]:
        figures["after_to_before"] = round(used["after"] / used["before"], 3)
    figures.update(seconds=round(elapsed, 1), load_average=f"{load_before:.2f} -> {os.getloadavg()[0]:.2f}")
    print(json.dumps(figures))
    return figures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.idle_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument("--settle-s", type=float, default=10.0, help="wait after the servers answer, before measuring")
    parser.add_argument("--baseline-tree", help="a source tree of ours to measure as 'before' beside this checkout")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args(sys.argv[1:])))
