"""The real coordinator for the fuzzer: CoordinatorServer + GroupRuntime with an in-memory store and the
real timer, on 127.0.0.1, until SIGTERM. Prints {"port": ..., "pid": ...} on stdout once listening; logs to
stderr as `<date> <time> LEVEL logger message` (INFO and up) so ERROR lines and tracebacks can be counted."""

from __future__ import annotations

import argparse
import asyncio
import collections
import ctypes
import gc
import json
import logging
import os
import signal
import sys
import tracemalloc

from coordinator.config import CoordinatorConfig
from coordinator.group.runtime import GroupRuntime
from coordinator.group.store import InMemoryGroupStore
from coordinator.server import ServerConfig, serve
from coordinator.timer import SystemTimer

log = logging.getLogger("tests.fuzz.service")


async def main(args: argparse.Namespace) -> None:
    timer = SystemTimer("fuzz")
    timer.start()
    config = CoordinatorConfig(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=100)
    coordinator = GroupRuntime(config, timer, InMemoryGroupStore())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)

    async def shutdown() -> None:
        await coordinator.shutdown()
        await timer.close()

    def started(server) -> None:  # type: ignore[no-untyped-def]
        print(json.dumps({"port": server.port, "pid": os.getpid()}), flush=True)
        if args.memory_report or args.trace_allocations:
            report = MemoryReport(server, coordinator, trace=args.trace_allocations)
            loop.add_signal_handler(signal.SIGUSR1, report.log)

    server_config = ServerConfig(listen_host="127.0.0.1", listen_port=args.port, idle_timeout_ms=args.idle_timeout_ms,
                                 shutdown_grace_ms=1_000)
    await serve(server_config, coordinator, stop=stop, on_started=started, on_shutdown=shutdown)


class MemoryReport:
    """On SIGUSR1 (with --memory-report): what the process holds and what grew since the last report: RSS
    (before and after glibc's malloc_trim), pymalloc's allocated blocks, object counts by type (gc) and the counts a leak would hide behind
    (connections, groups, members); with --trace-allocations also the allocation sites that grew
    (tracemalloc, which slows the service down severalfold)."""

    def __init__(self, server, coordinator, trace: bool) -> None:  # type: ignore[no-untyped-def]
        self.server, self.coordinator, self.trace = server, coordinator, trace
        if trace:
            tracemalloc.start(8)
            self.snapshot = tracemalloc.take_snapshot()
        self.types = self._types()

    @staticmethod
    def _types() -> collections.Counter:
        gc.collect()
        return collections.Counter(type(o).__name__ for o in gc.get_objects())

    def log(self) -> None:
        types = self._types()
        members = sum(len(group.members) for group in self.coordinator.groups.values())
        rss_kb = _rss_kb()
        trimmed_kb = _rss_kb() if _malloc_trim() else -1
        log.info("event=memory_report rss_kb=%d rss_after_malloc_trim_kb=%d allocated_blocks=%d gc_objects=%d "
                 "connections=%d groups=%d members=%d types_grown=%s", rss_kb, trimmed_kb,
                 sys.getallocatedblocks(), sum(types.values()), self.server.connection_count,
                 len(self.coordinator.groups), members, (types - self.types).most_common(6))
        self.types = types
        if self.trace:
            snapshot = tracemalloc.take_snapshot()
            log.info("event=memory_traced traced_kb=%d", tracemalloc.get_traced_memory()[0] // 1024)
            for stat in snapshot.compare_to(self.snapshot, "traceback")[:6]:
                log.info("event=memory_growth size_diff_kb=%.1f count_diff=%d at=%s", stat.size_diff / 1024,
                         stat.count_diff, " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}"
                                                      for f in reversed(stat.traceback[-4:])))
            self.snapshot = snapshot


def _rss_kb() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def _malloc_trim() -> bool:
    """Hand glibc's free heap memory back to the OS: what RSS then drops by was the allocator's, not ours."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--idle-timeout-ms", type=int, default=10_000)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--memory-report", action="store_true",
                        help="on SIGUSR1 log RSS, allocated blocks and object counts, and what grew since the last")
    parser.add_argument("--trace-allocations", action="store_true",
                        help="--memory-report plus tracemalloc's allocation sites that grew (slow)")
    arguments = parser.parse_args()
    logging.basicConfig(level=arguments.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(main(arguments))
