"""The running service: Kafka (given or embedded) → state store → group coordinator → wire server.

Start order follows Kafka's broker: the listener opens first and answers group requests with
COORDINATOR_LOAD_IN_PROGRESS while the state topic is read to its end, then the loaded groups are served.
Shutdown runs the other way: stop accepting, answer or fail parked requests, flush the store, stop the timer
and, if we started it, the embedded broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coordinator.config import CoordinatorConfig
from coordinator.group.runtime import GroupRuntime
from coordinator.group.observer import ObserverMux
from coordinator.relay import Relay, RelayConfig
from coordinator.runtime_health import RuntimeHealth
from coordinator.server.config import ServerConfig
from coordinator.server.listener import CoordinatorServer
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore
from coordinator.timer import MonotonicClock, SystemTimer

if TYPE_CHECKING:
    from coordinator.telemetry.service import Instrumented

log = logging.getLogger("coordinator.app")


@dataclass(frozen=True)
class ServiceOptions:
    server: ServerConfig = field(default_factory=ServerConfig)
    group: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    bootstrap: str | None = None  # None: run an embedded Apache Kafka broker
    kafka_data_dir: str | None = None  # embedded broker's data dir (None: temporary)
    state_topic: str = "__coordinator_state"
    state_replication_factor: int | None = None  # None: min(3, brokers)
    event_topic: str | None = "__coordinator_events"
    # State writes inside transactions (all or nothing, and fenced; docs/state-topic.md), or through the
    # idempotent producer (faster under many concurrent commits, but a write may be stored in part).
    transactional_writes: bool = True
    metrics_listen: tuple[str, int] | None = None  # Prometheus scrape endpoint (None: none)
    relay: RelayConfig | None = None  # front the cluster (coordinator/relay); `coordinator serve` turns it on


@dataclass
class RunningService:
    server: CoordinatorServer
    coordinator: GroupRuntime
    store: KafkaGroupStore
    bootstrap: str
    loaded: asyncio.Event
    health: RuntimeHealth | None = None  # loop lag and collector pauses (coordinator/runtime_health.py)


@contextlib.asynccontextmanager
async def running_service(options: ServiceOptions) -> AsyncIterator[RunningService]:
    """Everything started, state loading in the background; stopped cleanly on exit."""
    async with contextlib.AsyncExitStack() as stack:
        health = RuntimeHealth.from_env()  # first: it measures (and keeps cheap) every collection from here on
        health.start()
        stack.push_async_callback(health.stop)
        bootstrap = options.bootstrap or await _start_embedded_kafka(stack, options.kafka_data_dir)
        clock = MonotonicClock()
        timer = SystemTimer("coordinator", clock)
        timer.start()
        stack.push_async_callback(timer.close)

        store = KafkaGroupStore(_storage_config(options, bootstrap), clock)
        await store.start()
        stack.push_async_callback(store.close)

        observer = ObserverMux()
        coordinator = GroupRuntime(options.group, timer, store, clock, observer)
        coordinator.begin_loading()  # every partition, before the listener opens: no request may see an empty state
        instrumented = await _start_telemetry(stack, options, coordinator, observer, store)
        # stamps events with wall-clock time, not the monotonic clock; tracing first so events see the trace id
        events = store.event_observer(trace_id_for=instrumented.trace_id_for)
        if events is not None:
            observer.add(events)

        server = CoordinatorServer(options.server, coordinator, clock=clock, on_shutdown=coordinator.shutdown,
                                   relay=_relay(options, bootstrap))
        await server.start()
        stack.push_async_callback(server.close)
        if instrumented.metrics is not None:
            instrumented.metrics.watch_connections(lambda: server.connection_count)
            instrumented.metrics.watch_runtime_health(health)
            if server.relay is not None:
                instrumented.metrics.watch_relay(server.relay)

        loaded = asyncio.Event()
        background = _BackgroundTasks()
        stack.push_async_callback(background.cancel_all)
        background.start(_load_then_expire(store, coordinator, options.group, loaded), "state-load")
        yield RunningService(server, coordinator, store, bootstrap, loaded, health)


async def _start_embedded_kafka(stack: contextlib.AsyncExitStack, data_dir: str | None) -> str:
    from coordinator.embedded import EmbeddedKafka

    broker = EmbeddedKafka(data_dir)
    await broker.start()
    stack.callback(broker.remove_data)
    stack.push_async_callback(broker.stop)
    return broker.bootstrap


async def _start_telemetry(stack: contextlib.AsyncExitStack, options: ServiceOptions, coordinator: GroupRuntime,
                           observer: ObserverMux, store: KafkaGroupStore) -> "Instrumented":
    """OpenTelemetry from the OTEL_* variables (coordinator/telemetry/otel.py), flushed after everything else
    has stopped so the last rebalance's spans are exported."""
    from coordinator.telemetry.otel import start_telemetry
    from coordinator.telemetry.service import instrument

    telemetry = start_telemetry(options.metrics_listen)
    stack.push_async_callback(asyncio.to_thread, telemetry.shutdown)
    instrumented = instrument(telemetry, coordinator, observer, store)
    stack.callback(instrumented.uninstall)
    return instrumented


def _relay(options: ServiceOptions, bootstrap: str) -> Relay | None:
    if options.relay is None:
        return None
    from coordinator.server.handlers import served_ranges

    return Relay(options.relay, bootstrap, served=served_ranges(), max_frame_bytes=options.server.max_frame_bytes)


def _storage_config(options: ServiceOptions, bootstrap: str) -> StorageConfig:
    return StorageConfig(
        bootstrap=bootstrap,
        state_topic=options.state_topic,
        partitions=options.group.offsets_topic_num_partitions,
        replication_factor=options.state_replication_factor,
        segment_bytes=options.group.offsets_topic_segment_bytes,
        commit_timeout_ms=options.group.offsets_commit_timeout_ms,
        event_topic=options.event_topic,
        # One id per state topic: a restarted coordinator fences whatever an older process left open.
        transactional_id=f"group-coordinator-{options.state_topic}" if options.transactional_writes else None,
    )


async def _load_then_expire(store: KafkaGroupStore, coordinator: GroupRuntime, config: CoordinatorConfig,
                            loaded: asyncio.Event) -> None:
    retry_s = 1.0
    while True:
        try:
            await coordinator.load()
            break
        except Exception as exc:  # broker unreachable: keep answering LOAD_IN_PROGRESS and try again
            log.error("event=state_load_failed error=%r retry_in_s=%.0f", exc, retry_s)
            await asyncio.sleep(retry_s)
            retry_s = min(retry_s * 2, 30.0)
    # The loaded groups live as long as the process: move them out of the collector's reach, so a full
    # collection does not walk 100k groups and stall every heartbeat on the loop meanwhile. (Cost: a loaded
    # group deleted later is freed by reference counting only, so the most it can keep is the load itself.)
    gc.collect()
    gc.freeze()
    loaded.set()
    log.info("event=coordinator_ready groups=%d frozen_objects=%d", len(coordinator.groups), gc.get_freeze_count())
    # Kafka's offset cleanup task: first run right after loading, then every check interval.
    while True:
        try:
            expired = await coordinator.expire_offsets()
            if expired:
                log.info("event=offsets_expired count=%d", expired)
        except Exception:
            log.exception("event=offset_expiry_failed")
        await asyncio.sleep(config.offsets_retention_check_interval_ms / 1000)


class _BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, coro: object, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("event=background_task_failed task=%s error=%r", task.get_name(), task.exception())

    async def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def run_until(stop: asyncio.Event, options: ServiceOptions,
                    on_ready: Callable[[RunningService], None] | None = None) -> None:
    async with running_service(options) as service:
        if on_ready is not None:
            on_ready(service)
        await stop.wait()
