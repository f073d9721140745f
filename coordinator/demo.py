"""`coordinator demo`, the README's main command (`bash scripts/run.sh`): the whole story in one process tree.

Starts, in order: Apache Kafka (embedded, its data in a per-user state directory so a restart keeps the groups;
or the cluster given with --bootstrap-server), Jaeger when this build provisions one (the telemetry feature's
`coordinator.embedded.jaeger`), the coordinator (`coordinator serve`'s service, every serve flag accepted), and a
small population of simulated consumers (`coordinator simulate`) with a failure injected now and then. Prints the
addresses up front, then one line per notable event (a member failed, a rebalance done with its trace id, the real
consumers' record counts) under a live status line that fits the terminal; every log line goes to
<state dir>/demo.log. Ctrl-C (or --duration) stops everything it started, in reverse, saves the rebalance traces
for `coordinator trace`, and prints a summary and where to look next. `--consumers 0` runs the bare service.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import json
import logging
import os
import sys
import textwrap
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.app import ServiceOptions, running_service
from coordinator.demo_log import DemoEvent, DemoLog, event_lines
from coordinator.state_dir import default_state_dir
from coordinator.telemetry.trace_view import JAEGER_URL_FILE, SAVED_TRACES_FILE, JaegerQuery, TraceSourceError

if TYPE_CHECKING:
    from coordinator.embedded.secured_demo import SecuredDemoCluster
    from coordinator.loadgen.simulation import Progress
    from coordinator.security.clusters import ClusterSecurity

log = logging.getLogger("coordinator.demo")

MEMBERS_PER_GROUP = 4
RECORDS_EVERY_S = 30.0  # how often the real consumers' record counts get an event line
CONSUMER_PROTOCOL_MEMBERS = 2  # real consumers with group.protocol=consumer (KIP-848), in group demo-kip848
DEMO_TOPIC = "demo-orders"
DEMO_GROUP_PREFIX = "demo"  # every group of the demo's: demo-0000..., demo-real, demo-kip848


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
    # the embedded broker with SASL_SSL (SCRAM users, StandardAuthorizer, a test CA), the coordinator on it as
    # admin and listening with SASL_SSL, every consumer through it as alice (coordinator/embedded/secured_demo.py)
    secure: bool = False
    # lines logged before the demo's log file was open (the compiled build's), logged into it once it is
    startup_log: tuple[tuple[int, str], ...] = ()


async def run_demo(options: DemoOptions, stop: asyncio.Event, out: Any = sys.stdout) -> int:
    from rich.console import Console

    service_options = options.service
    if service_options.bootstrap is None and service_options.kafka_data_dir is None:
        data_dir = options.state_dir / ("kafka-secured" if options.secure else "kafka")
        data_dir.mkdir(parents=True, exist_ok=True)
        service_options = replace(service_options, kafka_data_dir=str(data_dir))
    options.state_dir.mkdir(parents=True, exist_ok=True)
    console = Console(file=out)
    width = console.width if console.is_terminal else None  # off a terminal (CI, a pipe): lines as they are

    def say(text: str, indent: str = "") -> None:
        for line in fit(text, width, indent):
            print(line, file=out, flush=True)

    demo_log = DemoLog(options.state_dir / "demo.log", traced=False)
    demo_log.open_log()  # from here on log lines go to the file; the terminal gets the events
    for level, line in options.startup_log:
        logging.getLogger("coordinator.compiled").log(level, line)
    started = time.monotonic()
    summary: dict[str, Any] | None = None
    saved: Path | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            jaeger_url: str | None = None
            if options.jaeger:
                jaeger_url, jaeger_line = await _maybe_start_jaeger(stack, options)
            else:
                jaeger_line = "not started (--no-jaeger)"
            demo_log.traced = jaeger_url is not None or _own_otel_endpoint() is not None
            if jaeger_url is not None:
                saved = options.state_dir / SAVED_TRACES_FILE
                _remember_jaeger(stack, options.state_dir, jaeger_url, saved)  # before the service: runs after it
            secured = None
            if options.secure:
                secured = await stack.enter_async_context(_secured_cluster(service_options))
                data_dir_text = service_options.kafka_data_dir
                service_options = secured.service_options(service_options)
            service = await stack.enter_async_context(running_service(service_options))
            node = service.server.node
            address = f"{node.host}:{node.port}"
            say(f"coordinator demo: point your consumers at bootstrap.servers={address}"
                + (f" with SASL_SSL as {secured.client_user}: the settings (Java's names) are in "
                   f"{secured.client_properties}" if secured is not None else ""), "    ")
            if secured is not None:
                say(f"  Kafka (state and events): {service.bootstrap} (embedded, SASL_SSL with SCRAM users and "
                    f"StandardAuthorizer, data in {data_dir_text}; the coordinator is its super user admin, the "
                    f"consumers alice with ACLs on their groups and topic)", "    ")
            else:
                say(f"  Kafka (state and events): {service.bootstrap}"
                    + (f" (embedded, data in {service_options.kafka_data_dir})" if options.service.bootstrap is None
                       else ""), "    ")
            say(f"  Jaeger: {jaeger_line}", "    ")
            say(f"  event topic: {service_options.event_topic or 'off'}; state topic: {service_options.state_topic}",
                "    ")
            say(f"  full log: {demo_log.path}", "    ")
            await _wait_loaded(service.loaded, stop)
            if options.consumers > 0 and not stop.is_set():
                summary = await _run_consumers(options, service_options, (node.host, node.port), service.bootstrap,
                                               stop, console, demo_log, say,
                                               secured.client_security() if secured is not None else None)
            elif not stop.is_set():
                say("  no simulated consumers (--consumers 0); Ctrl-C stops")
                await _wait(stop, options.duration_s)
            say("coordinator demo: stopping")
    finally:
        demo_log.close_log()
    for line in closing_lines(time.monotonic() - started, summary, demo_log, saved, options.state_dir):
        say(line, "      ")
    return 0


def _secured_cluster(service_options: ServiceOptions) -> contextlib.AbstractAsyncContextManager[SecuredDemoCluster]:
    """The demo's secured broker (--secure), its client user allowed what the demo's consumers do."""
    from coordinator.embedded.secured_demo import ClientGrants, secured_demo_cluster

    assert service_options.kafka_data_dir is not None
    return secured_demo_cluster(Path(service_options.kafka_data_dir),
                                ClientGrants(DEMO_GROUP_PREFIX, DEMO_TOPIC, service_options.event_topic))


def fit(text: str, width: int | None, indent: str = "") -> list[str]:
    """`text` as lines no wider than `width` (None: as it is); a word longer than a line (a path) is cut."""
    if width is None or len(text) <= width:
        return [text]
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [""]


def _own_otel_endpoint() -> str | None:
    return os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")


def _remember_jaeger(stack: contextlib.AsyncExitStack, state_dir: Path, jaeger_url: str, saved: Path) -> None:
    """While the demo runs, `coordinator trace` finds its Jaeger through the state directory; when it stops, the
    rebalance traces are saved there (Jaeger's memory goes with it) for `coordinator trace --file`."""
    url_file = state_dir / JAEGER_URL_FILE
    url_file.write_text(jaeger_url + "\n")

    async def save() -> None:
        url_file.unlink(missing_ok=True)
        query = JaegerQuery(jaeger_url, service=os.environ.get("OTEL_SERVICE_NAME") or "coordinator")
        try:
            document = await asyncio.to_thread(
                query.raw, "/api/traces?service={}&operation=rebalance&lookback=6h&limit=5000".format(
                    urllib.parse.quote(query.service)))
            saved.write_text(json.dumps(document))
        except (TraceSourceError, OSError) as exc:
            log.warning("event=demo_traces_not_saved path=%s error=%s", saved, exc)
            saved.unlink(missing_ok=True)

    stack.push_async_callback(save)


def closing_lines(ran_s: float, summary: dict[str, Any] | None, demo_log: DemoLog, saved: Path | None,
                  state_dir: Path) -> list[str]:
    """What happened, in a few lines, and where to look next."""
    lines = [f"coordinator demo: ran {ran_s:.0f} s"]
    if summary is not None:
        lines.append("  rebalances: " + _rebalances(summary["rebalances"], demo_log.rebalances))
        failures = summary["failures"]
        injected = ", ".join(f"{kind} {n}" for kind, n in failures["injected"].items()) or "none"
        lines.append(f"  failures injected: {injected}; crashes and hangs detected once: "
                     f"{failures['detected_once']} of {failures['to_detect']}")
        real = summary.get("real_consumers")
        kip848 = summary.get("consumer_protocol_consumers")
        # Both sets of real clients produce to the one topic and each group reads all of it: the count to read
        # against is what both produced (one producer's count alone looked like records read twice)
        produced = sum(clients["produced"] for clients in (real, kip848) if clients)
        if real:
            read = ", ".join(f"{c['client']} {c['records']}" for c in real["consumers"])
            lines.append(f"  records read through the relay ({real['group']}): {read} "
                         f"(of {produced} produced to {DEMO_TOPIC})")
        if kip848:
            read = ", ".join(f"{c['name']} {c['records']}" for c in kip848["consumers"])
            lines.append(f"  records read by group.protocol=consumer ({kip848['group']}): {read} "
                         f"(of {produced} produced to {DEMO_TOPIC})")
    noted = ", ".join(f"{kind} {n}" for kind, n in demo_log.warnings.most_common(4))
    lines.append(f"  log: {sum(demo_log.warnings.values())} warnings" + (f" ({noted})" if noted else "")
                 + f", {demo_log.errors} errors")
    lines.append("where to look next")
    if saved is not None and saved.exists():
        trace = "coordinator trace" + ("" if state_dir == default_state_dir() else f" --file {saved}")
        lines += ["  every rebalance of this run, one line each:", f"    {trace} --list"]
        failed = [e for e in demo_log.rebalances if e.trace_id and e.reason == "session_timeout"] or \
            [e for e in demo_log.rebalances if e.trace_id]
        if failed:
            lines += [f"  one rebalance ({failed[-1].reason or 'the last'}), drawn as a waterfall:",
                      f"    {trace} {failed[-1].trace_id[:8]}"]  # type: ignore[index]
        lines += ["  rebalances as they happen, while a demo runs:", "    coordinator trace --follow"]
    lines += ["  everything the coordinator logged:", f"    {demo_log.path}"]
    return lines


def _rebalances(simulated: dict[str, Any], seen: list[DemoEvent]) -> str:
    """The coordinator's own account (every group, its reason categories, its durations) when its log lines
    said it, else what the simulated members saw."""
    took = sorted(e.took_ms for e in seen if e.took_ms is not None)
    if took:
        reasons = collections.Counter(e.reason or "other" for e in seen)
        count, p50, top = len(seen), took[len(took) // 2], took[-1]
    else:
        reasons, count = collections.Counter(simulated["by_reason"]), simulated["count"]
        p50, top = simulated["duration_ms"].get("p50"), simulated["duration_ms"].get("max")
    text = f"{count}" + (f" ({', '.join(f'{r} {n}' for r, n in reasons.most_common())})" if reasons else "")
    return text + (f"; p50 {_ms(p50)}, max {_ms(top)}" if count and p50 is not None else "")


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


async def _wait_loaded(loaded: asyncio.Event, stop: asyncio.Event) -> None:
    waiters = {asyncio.ensure_future(loaded.wait()), asyncio.ensure_future(stop.wait())}
    _done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()


async def _wait(stop: asyncio.Event, duration_s: float | None) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), duration_s)


async def _run_consumers(options: DemoOptions, service_options: ServiceOptions, address: tuple[str, int],
                         bootstrap: str, stop: asyncio.Event, console: Any, demo_log: DemoLog,
                         say: Callable[..., None], security: ClusterSecurity | None = None) -> dict[str, Any]:
    from coordinator.loadgen import SimOptions, Simulation
    from coordinator.loadgen.display import LiveStatus
    from coordinator.loadgen.real import RealClients

    groups = max(1, -(-options.consumers // MEMBERS_PER_GROUP))
    real = options.real_consumers if service_options.relay is not None else 0  # they read through the relay
    sim = Simulation(SimOptions(
        coordinator=address, bootstrap_server=bootstrap, groups=groups,
        members=min(MEMBERS_PER_GROUP, options.consumers), topic=DEMO_TOPIC, partitions=12,
        group_prefix=DEMO_GROUP_PREFIX, session_ms=options.session_ms, rebalance_ms=30_000,
        heartbeat_ms=options.heartbeat_ms,
        commit_interval_ms=5_000, duration_s=options.duration_s or 10 * 365 * 86400.0, settle_timeout_s=30,
        failure_rate_per_min=options.failure_rate_per_min, failure_kinds=("crash", "hang", "leave", "slow"),
        event_topic=service_options.event_topic, real=real, security=security))
    say(f"  simulated consumers: {groups} groups × {min(MEMBERS_PER_GROUP, options.consumers)} members on topic "
        f"demo-orders, ~{options.failure_rate_per_min:g} failures a minute", "    ")
    # beside them, a consumer group of Kafka 4's protocol (KIP-848): its rebalances are group epoch bumps
    consumer_protocol = RealClients(f"{address[0]}:{address[1]}", DEMO_TOPIC, CONSUMER_PROTOCOL_MEMBERS,
                                    "demo-kip848", records_per_s=5.0, group_protocol="consumer",
                                    security=security) if real else None
    if real:
        say(f"  real consumers: {real} (confluent-kafka, aiokafka) in group demo-real on demo-orders, and "
            f"{CONSUMER_PROTOCOL_MEMBERS} confluent-kafka with group.protocol=consumer in group demo-kip848, through "
            f"bootstrap.servers={address[0]}:{address[1]}", "    ")
    say("  Ctrl-C stops; in another terminal, `coordinator trace --follow` draws rebalances", "    ")
    live = LiveStatus(console, every_s=10, fit=True)
    next_records = time.monotonic() + RECORDS_EVERY_S

    def on_progress(progress: Progress) -> None:
        nonlocal next_records
        if consumer_protocol is not None and not consumer_protocol.started:  # the simulation made the topic
            consumer_protocol.start()
        for event in demo_log.drain():
            live.event("\n".join(event_lines(event, live.width)))
        reals = [*(sim.real.consumers if sim.real is not None else ()),
                 *(consumer_protocol.consumers if consumer_protocol is not None else ())]
        records = sum(c.records for c in reals) if sim.real is not None else None
        if sim.real is not None and time.monotonic() >= next_records:
            next_records = time.monotonic() + RECORDS_EVERY_S
            read = ", ".join(f"{c.name} {c.records}" for c in reals)
            live.event("\n".join(event_lines(DemoEvent(time.time(), "records", f"≡ records read: {read}"),
                                              live.width)))
        live.update(progress, records)

    with live:
        running = asyncio.ensure_future(sim.run(on_progress))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not running.done():  # Ctrl-C: the members stop (leaving their groups); the summary is of what ran
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            summary = sim.summary()
        else:
            summary = running.result()
        if consumer_protocol is not None:
            await consumer_protocol.stop()
            summary["consumer_protocol_consumers"] = consumer_protocol.summary()
            log.info("event=demo_consumer_protocol_group %s", consumer_protocol.status())
        for event in demo_log.drain():
            live.event("\n".join(event_lines(event, live.width)))
    log.info("event=demo_summary\n%s", _table_text(summary))  # the simulation's full table, in the log file
    return summary


def _table_text(summary: dict[str, Any]) -> str:
    import io

    from rich.console import Console

    from coordinator.loadgen.display import summary_table

    buffer = io.StringIO()
    Console(file=buffer, width=120, color_system=None).print(summary_table(summary))
    return buffer.getvalue()


async def _maybe_start_jaeger(stack: contextlib.AsyncExitStack, options: DemoOptions) -> tuple[str | None, str]:
    """Jaeger from the telemetry feature (`coordinator.embedded.jaeger`) when this build has it and a binary is at
    hand (PATH, or the module build scripts/setup.sh makes); the coordinator then exports to it through the
    standard OTEL_* variables (unless the user set their own endpoint). Returns its query URL (None: not started)
    and what to tell the user."""
    try:
        jaeger_module = importlib.import_module("coordinator.embedded.jaeger")
    except ImportError:
        return None, "not started (this build has no embedded Jaeger)"
    own = _own_otel_endpoint()
    if own:
        return None, f"not started: traces go to your OTEL_* endpoint {own}"
    try:
        binary = jaeger_module.find_jaeger(None, build=False)
        jaeger = jaeger_module.EmbeddedJaeger(binary.path)
        jaeger.start()  # on this (the loop's) thread: the process dies with the thread that started it
    except Exception as exc:  # no binary, or it would not start: the demo runs without traces
        log.warning("event=demo_jaeger_unavailable error=%s", exc)
        return None, f"not started ({exc}); the demo runs without traces"
    stack.callback(jaeger.stop)
    # traces only: Jaeger takes no metrics
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{jaeger.otlp_http_endpoint}/v1/traces"
    os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    if binary.has_ui:
        return jaeger.query_url, f"{jaeger.query_url} (web UI; `coordinator trace` in a terminal)"
    # the module build scripts/setup.sh makes has no web UI: the terminal has the traces
    return jaeger.query_url, f"{jaeger.query_url} (API only; `coordinator trace` draws traces)"
