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
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coordinator.cluster.directory import OwnerMapDirectory
from coordinator.cluster.identity import InstanceEndpoint, client_id_for
from coordinator.cluster.membership import Membership, instances_group_for
from coordinator.cluster.owner_map import OwnerMap
from coordinator.cluster.ownership import GroupAssignmentReader, Ownership
from coordinator.config import CoordinatorConfig
from coordinator.group.modern.group_configs import NAMES as GROUP_CONFIG_NAMES
from coordinator.group.modern.regex import REGEX_BATCH_REFRESH_INTERVAL_MS
from coordinator.group.runtime import GroupRuntime
from coordinator.group.observer import ObserverMux
from coordinator.group.status import ShardStatus
from coordinator.relay import Relay, RelayConfig
from coordinator.relay.group_configs import describe_group_configs
from coordinator.runtime_health import RuntimeHealth
from coordinator.security.access import AccessSettings
from coordinator.security.acl_cache import AclCache
from coordinator.security.client_config import ClientSecurity
from coordinator.security.clusters import cluster_security, use_for_cluster
from coordinator.security.connections import ClusterAccessError, check_cluster_access
from coordinator.security.sasl_client import supports as sasl_supported
from coordinator.security.sasl_passthrough import ExpiredConnections
from coordinator.security.topic_writers import warn_about_other_writers
from coordinator.server.config import ServerConfig
from coordinator.server.listener import CoordinatorServer
from coordinator.storage.config import (
    DEFAULT_EVENT_DELIVERY_TIMEOUT_MS, DEFAULT_EVENT_QUEUE_MAX_MESSAGES, DEFAULT_MARKERS_SETTLE_MS, StorageConfig,
)
from coordinator.storage.kafka_store import KafkaGroupStore
from coordinator.telemetry.events import EventTopicObserver, start_event_publisher
from coordinator.timer import Clock, MonotonicClock, SystemTimer

if TYPE_CHECKING:
    from coordinator.telemetry.service import Instrumented
    from coordinator.telemetry.otel import Telemetry

log = logging.getLogger("coordinator.app")


@dataclass(frozen=True)
class ServiceOptions:
    server: ServerConfig = field(default_factory=ServerConfig)
    group: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    bootstrap: str | None = None  # None: run an embedded Apache Kafka broker
    kafka_data_dir: str | None = None  # embedded broker's data dir (None: temporary)
    state_topic: str = "__coordinator_state"
    state_replication_factor: int | None = None  # None: group.offsets_topic_replication_factor
    event_topic: str | None = "__coordinator_events"
    event_delivery_timeout_ms: int = DEFAULT_EVENT_DELIVERY_TIMEOUT_MS  # an event not acknowledged by then is lost
    event_queue_max_messages: int = DEFAULT_EVENT_QUEUE_MAX_MESSAGES  # held meanwhile; the newest beyond: dropped
    # State writes inside transactions (all or nothing, and fenced; docs/state-topic.md), or through the
    # idempotent producer (faster under many concurrent commits, but a write may be stored in part).
    transactional_writes: bool = True
    state_writer: str = "librdkafka"  # the transactions' client: librdkafka or native (StorageConfig.state_writer)
    markers_settle_ms: float = DEFAULT_MARKERS_SETTLE_MS  # StorageConfig.markers_settle_ms
    metrics_listen: tuple[str, int] | None = None  # Prometheus scrape endpoint (None: none)
    relay: RelayConfig | None = None  # front the cluster (coordinator/relay); `coordinator serve` turns it on
    # Several instances on one state topic (docs/architecture.md, "Several instances"): None = this instance owns
    # every partition. With an id, Kafka assigns the partitions among the instances' consumer group.
    instance_id: str | None = None
    instances_group: str | None = None  # None: "<state topic>.coordinators"
    instance_session_timeout_ms: int = 6_000
    # How every client of ours reaches the cluster (--command-config): TLS, SASL. None: PLAINTEXT.
    client_security: ClientSecurity | None = None


@dataclass
class RunningService:
    server: CoordinatorServer
    coordinator: GroupRuntime
    store: KafkaGroupStore
    bootstrap: str
    loaded: asyncio.Event
    health: RuntimeHealth | None = None  # loop lag and collector pauses (coordinator/runtime_health.py)
    ownership: Ownership | None = None  # several instances: the partitions this one owns


@contextlib.asynccontextmanager
async def running_service(options: ServiceOptions) -> AsyncIterator[RunningService]:
    """Everything started, state loading in the background; stopped cleanly on exit."""
    async with contextlib.AsyncExitStack() as stack:
        health = RuntimeHealth.from_env()  # first: it measures (and keeps cheap) every collection from here on
        health.start()
        stack.push_async_callback(health.stop)
        bootstrap = options.bootstrap or await _start_embedded_kafka(stack, options.kafka_data_dir)
        if options.client_security is not None:
            await _secure_cluster_access(stack, options, bootstrap, options.client_security)
        # the cluster's ACLs read before a client is served (an embedded broker has no authorizer)
        acl_cache = None if options.bootstrap is None else await _start_acl_cache(stack, options, bootstrap)
        clock = MonotonicClock()
        timer = SystemTimer("coordinator", clock)
        timer.start()
        stack.push_async_callback(timer.close)

        storage_config = _storage_config(options, bootstrap)
        store = _kafka_store(options, storage_config, clock)
        await store.start()
        stack.push_async_callback(store.close)
        publisher = await start_event_publisher(storage_config)
        if publisher is not None:  # closed first: flushes the queued events
            stack.push_async_callback(asyncio.to_thread, publisher.close_blocking)
        if options.client_security is not None and acl_cache is not None:  # who else may write our topics
            warn_about_other_writers(acl_cache.authorizer, options.client_security.principal,
                                     [t for t in (options.state_topic, options.event_topic) if t])

        observer = ObserverMux()
        coordinator = GroupRuntime(options.group, timer, store, clock, observer)
        if options.instance_id is None:
            coordinator.begin_loading()  # every partition, before the listener opens: no request may see an empty state
        else:
            for shard in coordinator.shards:  # NOT_COORDINATOR until Kafka assigns a partition to this instance
                shard.status = ShardStatus.UNOWNED
        instrumented = await _start_telemetry(stack, options, coordinator, observer)
        # stamps events with wall-clock time, not the monotonic clock; tracing first so events see the trace id
        if publisher is not None:
            observer.add(EventTopicObserver(publisher, trace_id_for=instrumented.trace_id_for))
            if instrumented.metrics is not None:
                instrumented.metrics.watch_events(publisher)

        ownership = None if options.instance_id is None else _ownership(options, coordinator, store, clock)
        # several instances: who owns which group's partition (FindCoordinator, Metadata); the owner map is
        # attached once our port is known (_start_ownership)
        directory = None if ownership is None else OwnerMapDirectory(coordinator.num_partitions,
                                                                     options.server.cluster_id)
        server = CoordinatorServer(options.server, coordinator if ownership is None else ownership.service,
                                   clock=clock, on_shutdown=coordinator.shutdown, relay=_relay(options, bootstrap),
                                   directory=directory, authorizer=None if acl_cache is None else acl_cache.authorizer)
        await server.start()
        stack.push_async_callback(server.close)
        if server.relay is not None:  # consumer groups (KIP-848) take topic ids and partitions from the cluster
            _watch_cluster_topics(coordinator, server.relay)
            _read_group_configs(coordinator, server.relay)
        if ownership is not None:  # after the listener: our endpoint (its port) goes into the membership client.id
            assert directory is not None
            await _start_ownership(stack, ownership, options, bootstrap, server, directory)
        if instrumented.metrics is not None:
            instrumented.metrics.watch_connections(lambda: server.connection_count)
            instrumented.metrics.watch_runtime_health(health)
            if server.relay is not None:
                instrumented.metrics.watch_relay(server.relay)
            if acl_cache is not None:
                instrumented.metrics.watch_acls(acl_cache)
            if options.server.sasl_passthrough:
                instrumented.metrics.watch_sasl_sessions(ExpiredConnections)

        loaded = asyncio.Event()
        background = _BackgroundTasks()
        stack.push_async_callback(background.cancel_all)
        if ownership is None:
            background.start(_load_then_expire(store, coordinator, options.group, loaded), "state-load")
        else:
            background.start(_settle_then_expire(ownership, coordinator, options.group, loaded), "offset-expiry")
        yield RunningService(server, coordinator, store, bootstrap, loaded, health, ownership)


async def _start_embedded_kafka(stack: contextlib.AsyncExitStack, data_dir: str | None) -> str:
    from coordinator.embedded import EmbeddedKafka

    broker = EmbeddedKafka(data_dir)
    await broker.start()
    stack.callback(broker.remove_data)
    stack.push_async_callback(broker.stop)
    return broker.bootstrap


async def _secure_cluster_access(stack: contextlib.AsyncExitStack, options: ServiceOptions, bootstrap: str,
                                 security: ClientSecurity) -> None:
    """Every client of `bootstrap` made from here on uses `security`; the cluster must accept it now (a wrong
    password or CA is one clear error at start, not librdkafka retrying forever)."""
    stack.callback(use_for_cluster(bootstrap, security))
    log.info("event=cluster_security bootstrap=%s %s", bootstrap, security.describe())
    passthrough = options.relay is not None and options.relay.sasl_passthrough
    if passthrough and not security.uses_sasl:
        raise ClusterAccessError(f"SASL on our listeners passes each client's exchange through to the cluster, but "
                                 f"--command-config has security.protocol={security.protocol}")
    if options.relay is not None and not passthrough and (security.uses_sasl or security.certificate_location):
        log.warning("event=relay_uses_coordinator_identity detail=the relay's upstream connections authenticate "
                    "as the coordinator (%s): a client of the relay reaches the cluster with the coordinator's "
                    "rights until SASL passes through the relay (docs/security.md)", security.describe())
    if options.relay is not None and security.uses_sasl and not sasl_supported(security):
        raise ClusterAccessError(f"sasl.mechanism={security.mechanism} through a token endpoint: the relay's own "
                                 f"connections cannot authenticate that way yet; run with --no-relay "
                                 f"(docs/security.md)")
    entry = cluster_security(bootstrap)
    assert entry is not None
    await check_cluster_access(bootstrap, entry)


async def _start_acl_cache(stack: contextlib.AsyncExitStack, options: ServiceOptions, bootstrap: str) -> AclCache:
    """The cluster's ACLs, enforced on the group APIs when the cluster has an authorizer (docs/security.md)."""
    access = options.server.access or AccessSettings()
    cache = AclCache(bootstrap, access.authorizer(), access.refresh_interval_ms)
    stack.push_async_callback(cache.close)
    await cache.start()
    return cache


async def _start_telemetry(stack: contextlib.AsyncExitStack, options: ServiceOptions, coordinator: GroupRuntime,
                           observer: ObserverMux) -> "Instrumented":
    """OpenTelemetry from the OTEL_* variables (coordinator/telemetry/otel.py), flushed after everything else
    has stopped so the last rebalance's spans are exported."""
    # The SDK's and its exporters' imports and set-up take ~85 ms of CPU: on a thread, so the loop (the relay
    # and the load already running) is not held that long (the lag probe reported it as a loop_stall)
    telemetry = await asyncio.to_thread(_build_telemetry, options.metrics_listen)
    from coordinator.telemetry.service import instrument

    stack.push_async_callback(asyncio.to_thread, telemetry.shutdown)
    instrumented = instrument(telemetry, coordinator, observer)
    stack.callback(instrumented.uninstall)
    return instrumented


def _build_telemetry(metrics_listen: tuple[str, int] | None) -> "Telemetry":
    from coordinator.telemetry.otel import start_telemetry
    import coordinator.telemetry.service  # noqa: F401 -- imported here, off the loop

    return start_telemetry(metrics_listen)


def _watch_cluster_topics(coordinator: GroupRuntime, relay: Relay) -> None:
    """Consumer groups see the relay's view of the cluster's topics, refreshed for a group's subscribed topics
    when older than the group's heartbeat interval (new partitions reach the target within a heartbeat or two;
    a topic not known yet is learnt before the heartbeat is answered, a known one in the background)."""
    max_age_ms = coordinator.config.group_consumer_heartbeat_interval_ms
    coordinator.consumer_groups.topics = relay.cluster
    coordinator.refresh_topics = lambda names: relay.cluster.refresh(names, max_age_ms)
    coordinator.stale_topics = lambda names: relay.cluster.stale(names, max_age_ms)
    coordinator.consumer_groups.refresh_all_topics = lambda: relay.cluster.refresh_all(REGEX_BATCH_REFRESH_INTERVAL_MS)


def _read_group_configs(coordinator: GroupRuntime, relay: Relay) -> None:
    """Consumer groups take their group-level configuration from the cluster (DescribeConfigs), read again at
    once when the relay forwards an alteration of it (coordinator/group/modern/group_configs.py)."""
    configs = coordinator.consumer_groups.group_configs
    configs.describe = lambda group_ids: describe_group_configs(relay, group_ids, GROUP_CONFIG_NAMES)
    relay.on_group_configs_altered = configs.invalidate


def _relay(options: ServiceOptions, bootstrap: str) -> Relay | None:
    if options.relay is None:
        return None
    from coordinator.server.handlers import served_ranges

    return Relay(options.relay, bootstrap, served=served_ranges(), max_frame_bytes=options.server.max_frame_bytes)


def _ownership(options: ServiceOptions, runtime: GroupRuntime, store: KafkaGroupStore,
               clock: MonotonicClock) -> Ownership:
    """Made before the listener opens (the server calls its guarded service); started in `_start_ownership`."""
    assert options.instance_id is not None
    ownership = Ownership(runtime, instance_id=options.instance_id,
                          group_id=options.instances_group or instances_group_for(options.state_topic),
                          topic=options.state_topic, session_timeout_ms=options.instance_session_timeout_ms,
                          clock=clock)
    store.on_fenced = ownership.on_fenced  # a fenced write: that partition is unloaded at once
    return ownership


async def _start_ownership(stack: contextlib.AsyncExitStack, ownership: Ownership, options: ServiceOptions,
                           bootstrap: str, server: CoordinatorServer, directory: OwnerMapDirectory) -> None:
    """Joins the instances group once the listener is open: our endpoint (its port) is in the client.id and in
    the owner map, which the server's directory reads from then on."""
    node = server.node
    me = InstanceEndpoint(ownership.instance_id, node.node_id, node.host, node.port)
    client_id = client_id_for(me)
    owner_map = OwnerMap(bootstrap, ownership.group_id, ownership.topic, ownership.runtime.num_partitions, me)
    await owner_map.start()
    stack.push_async_callback(owner_map.close)
    directory.attach(owner_map)

    def owned(partitions: set[int]) -> None:
        owner_map.set_own(partitions)  # ours at once; the others' from DescribeGroups, asked again now
        owner_map.refresh_soon()

    ownership.on_owned = owned
    membership = Membership(bootstrap=bootstrap, group_id=ownership.group_id, topic=ownership.topic,
                            client_id=client_id, session_timeout_ms=options.instance_session_timeout_ms,
                            on_assigned=ownership.on_assigned, on_revoked=ownership.on_revoked,
                            on_lost=ownership.on_lost)
    stack.push_async_callback(ownership.close)  # first on the way out: revoke (unload) and leave the group
    # the guard's confirmation asks the owner map for a description taken after the stall: one AdminClient
    await ownership.start(membership, GroupAssignmentReader(owner_map.describe_fresh))


def _storage_config(options: ServiceOptions, bootstrap: str) -> StorageConfig:
    settings: dict[str, Any] = dict(
        bootstrap=bootstrap,
        state_topic=options.state_topic,
        partitions=options.group.offsets_topic_num_partitions,
        replication_factor=(options.state_replication_factor if options.state_replication_factor is not None
                            else options.group.offsets_topic_replication_factor),
        segment_bytes=options.group.offsets_topic_segment_bytes,
        commit_timeout_ms=options.group.offsets_commit_timeout_ms,
        event_topic=options.event_topic,
        event_delivery_timeout_ms=options.event_delivery_timeout_ms,
        event_queue_max_messages=options.event_queue_max_messages,
        # One id per state topic: a restarted coordinator fences whatever an older process left open.
        transactional_id=f"group-coordinator-{options.state_topic}" if options.transactional_writes else None,
        state_writer=options.state_writer,
        markers_settle_ms=options.markers_settle_ms,
    )
    settings.update(_fencing(options))
    return StorageConfig(**settings)


def _kafka_store(options: ServiceOptions, storage_config: StorageConfig, clock: Clock | None = None
                 ) -> KafkaGroupStore:
    return KafkaGroupStore(storage_config, clock,
                           load_buffer_bytes=options.group.offsets_load_buffer_size)


def _fencing(options: ServiceOptions) -> dict[str, object]:
    """Several instances: one transactional producer per owned partition (ids "<id>-p<partition>"), so the
    next owner's init_transactions fences the previous one, partition by partition."""
    if options.instance_id is None:
        return {}
    return {"partition_fencing": True, "transactional_id": f"group-coordinator-{options.state_topic}"}


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
    await _expire_offsets_forever(coordinator, config)


async def _settle_then_expire(ownership: Ownership, coordinator: GroupRuntime, config: CoordinatorConfig,
                              loaded: asyncio.Event) -> None:
    """Several instances: `loaded` once the first assignment is served (the collector policy is Ownership's);
    offset expiry runs over the partitions served at the time (the runtime skips shards not ACTIVE)."""
    await ownership.settled.wait()
    loaded.set()
    log.info("event=coordinator_ready instance=%s owned_partitions=%s groups=%d", ownership.instance_id,
             sorted(ownership.owned), len(coordinator.groups))
    await _expire_offsets_forever(coordinator, config)


async def _expire_offsets_forever(coordinator: GroupRuntime, config: CoordinatorConfig) -> None:
    """Kafka's offset cleanup task: first run right away, then every check interval."""
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

    def start(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
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
