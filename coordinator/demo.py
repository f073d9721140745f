"""`coordinator demo`, the README's main command (`bash scripts/run.sh`): the whole story in one process tree.

Starts, in order: Apache Kafka (embedded, its data in a per-user state directory so a restart keeps the groups;
or the cluster given with --bootstrap-server), Jaeger when this build provisions one (the telemetry feature's
`coordinator.embedded.jaeger`), the coordinator (`coordinator serve`'s service, every serve flag accepted), and a
small population of simulated consumers (`coordinator simulate`) with a failure injected now and then. Prints the
addresses up front, then one live status line. Ctrl-C (or --duration) stops everything it started, in reverse.
`--consumers 0` runs the bare service.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from coordinator.app import ServiceOptions, running_service

log = logging.getLogger("coordinator.demo")

MEMBERS_PER_GROUP = 4


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kafka-group-coordinator"


@dataclass(frozen=True)
class DemoOptions:
    service: ServiceOptions
    state_dir: Path
    consumers: int = 12
    failure_rate_per_min: float = 3.0
    duration_s: float | None = None
    jaeger: bool = True
    session_ms: int = 10_000
    heartbeat_ms: int = 1_000
    real_consumers: int = 2  # real clients beside the simulated ones, through the relay (none without it)


async def run_demo(options: DemoOptions, stop: asyncio.Event, out: Any = sys.stdout) -> int:
    service_options = options.service
    if service_options.bootstrap is None and service_options.kafka_data_dir is None:
        data_dir = options.state_dir / "kafka"
        data_dir.mkdir(parents=True, exist_ok=True)
        service_options = replace(service_options, kafka_data_dir=str(data_dir))
    async with contextlib.AsyncExitStack() as stack:
        jaeger_line = await _maybe_start_jaeger(stack, options) if options.jaeger else "not started (--no-jaeger)"
        service = await stack.enter_async_context(running_service(service_options))
        node = service.server.node
        address = f"{node.host}:{node.port}"
        print(f"coordinator demo: point your consumers at bootstrap.servers={address}", file=out, flush=True)
        print(f"  Kafka (state and events): {service.bootstrap}"
              + (f" (embedded, data in {service_options.kafka_data_dir})" if options.service.bootstrap is None
                 else ""), file=out, flush=True)
        print(f"  Jaeger: {jaeger_line}", file=out, flush=True)
        print(f"  event topic: {service_options.event_topic or 'off'}; state topic: {service_options.state_topic}",
              file=out, flush=True)
        await _wait_loaded(service.loaded, stop)
        if options.consumers > 0 and not stop.is_set():
            await _run_consumers(options, service_options, (node.host, node.port), service.bootstrap, stop, out)
        elif not stop.is_set():
            print("  no simulated consumers (--consumers 0); Ctrl-C stops", file=out, flush=True)
            await _wait(stop, options.duration_s)
        print("coordinator demo: stopping", file=out, flush=True)
    return 0


async def _wait_loaded(loaded: asyncio.Event, stop: asyncio.Event) -> None:
    waiters = {asyncio.ensure_future(loaded.wait()), asyncio.ensure_future(stop.wait())}
    _done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()


async def _wait(stop: asyncio.Event, duration_s: float | None) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), duration_s)


async def _run_consumers(options: DemoOptions, service_options: ServiceOptions, address: tuple[str, int],
                         bootstrap: str, stop: asyncio.Event, out: Any) -> None:
    from rich.console import Console

    from coordinator.loadgen import SimOptions, Simulation
    from coordinator.loadgen.display import LiveStatus, summary_table

    groups = max(1, -(-options.consumers // MEMBERS_PER_GROUP))
    real = options.real_consumers if service_options.relay is not None else 0  # they read through the relay
    sim = Simulation(SimOptions(
        coordinator=address, bootstrap_server=bootstrap, groups=groups,
        members=min(MEMBERS_PER_GROUP, options.consumers), topic="demo-orders", partitions=12,
        group_prefix="demo", session_ms=options.session_ms, rebalance_ms=30_000, heartbeat_ms=options.heartbeat_ms,
        commit_interval_ms=5_000, duration_s=options.duration_s or 10 * 365 * 86400.0, settle_timeout_s=30,
        failure_rate_per_min=options.failure_rate_per_min, failure_kinds=("crash", "hang", "leave", "slow"),
        event_topic=service_options.event_topic, real=real))
    print(f"  simulated consumers: {groups} groups × {min(MEMBERS_PER_GROUP, options.consumers)} members on topic "
          f"demo-orders, ~{options.failure_rate_per_min:g} failures a minute", file=out, flush=True)
    if real:
        print(f"  real consumers: {real} (confluent-kafka, aiokafka) in group demo-real on demo-orders, through "
              f"bootstrap.servers={address[0]}:{address[1]}", file=out, flush=True)
    console = Console(file=out)
    with LiveStatus(console, every_s=10) as live:
        running = asyncio.ensure_future(sim.run(live.update))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not running.done():
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            return
    console.print(summary_table(running.result()))


async def _maybe_start_jaeger(stack: contextlib.AsyncExitStack, options: DemoOptions) -> str:
    """Jaeger from the telemetry feature (`coordinator.embedded.jaeger`) when this build has it and a binary is at
    hand (PATH, or the module build scripts/setup.sh makes); the coordinator then exports to it through the
    standard OTEL_* variables (unless the user set their own endpoint). Returns what to tell the user."""
    try:
        jaeger_module = importlib.import_module("coordinator.embedded.jaeger")
    except ImportError:
        return "not started (this build has no embedded Jaeger)"
    own = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if own:
        return f"not started: traces go to your OTEL_* endpoint {own}"
    try:
        binary = jaeger_module.find_jaeger(None, build=False)
        jaeger = jaeger_module.EmbeddedJaeger(binary.path)
        jaeger.start()  # on this (the loop's) thread: the process dies with the thread that started it
    except Exception as exc:  # no binary, or it would not start: the demo runs without traces
        log.warning("event=demo_jaeger_unavailable error=%s", exc)
        return f"not started ({exc}); the demo runs without traces"
    stack.callback(jaeger.stop)
    # traces only: Jaeger takes no metrics
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{jaeger.otlp_http_endpoint}/v1/traces"
    os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    if binary.has_ui:
        return f"{jaeger.query_url} (web UI)"
    # the module build scripts/setup.sh makes serves a placeholder page: say where the traces are instead
    service = os.environ.get("OTEL_SERVICE_NAME") or "coordinator"
    return (f"{jaeger.query_url} (the module build scripts/setup.sh made: its web UI is a placeholder; traces as "
            f"JSON at {jaeger.query_url}/api/traces?service={service}; a `jaeger` binary on PATH gives the UI)")
