"""Creating and checking the state and event topics through confluent-kafka's AdminClient.

Every AdminClient call returns concurrent futures, so the event loop never blocks on the admin client.

Why `Admin` boxes the client: librdkafka aborts the whole process if a client is destroyed on one of its own
threads, and confluent-kafka runs Python code (future completions, log callbacks) on those threads — where
Python's cyclic garbage collector may also run. A client that ends up in a reference cycle (a traceback
holding the frames that held it is enough) can therefore be freed there. Frames and tracebacks only ever
hold the box; `release()` drops the client on the caller's thread.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from coordinator.security.clusters import secured
from coordinator.storage.config import StorageConfig, min_insync_replicas
from coordinator.storage.kafka_logs import librdkafka_logger

log = logging.getLogger("coordinator.storage")

_METADATA_RETRY_S = 0.1  # a topic created by another client, not in this broker's metadata yet: asked again after


class TopicMismatchError(RuntimeError):
    """The state topic exists but cannot be used as it is (e.g. another partition count)."""


class Admin:
    """An AdminClient that is destroyed when released, on the releasing thread (see the module docstring)."""

    def __init__(self, config: StorageConfig) -> None:
        # dict[str, Any]: confluent-kafka's stubs type config values as str | int | float, but it takes a logger
        settings: dict[str, Any] = {"bootstrap.servers": config.bootstrap, "client.id": f"{config.client_id}-admin",
                                    "logger": librdkafka_logger("admin")}
        self._client: AdminClient | None = AdminClient(secured(settings))

    @property
    def client(self) -> AdminClient:
        if self._client is None:
            raise RuntimeError("admin client already released")
        return self._client

    def release(self) -> None:
        self._client = None


def make_admin(config: StorageConfig) -> Admin:
    return Admin(config)


async def broker_count(admin: Admin, timeout_ms: int = 30_000) -> int:
    cluster = await asyncio.wrap_future(admin.client.describe_cluster(request_timeout=timeout_ms / 1000))
    return len(cluster.nodes)


async def partition_count(admin: Admin, topic: str, timeout_ms: int = 30_000) -> int | None:
    """Partitions of `topic`, or None if it does not exist."""
    futures = admin.client.describe_topics(TopicCollection([topic]), request_timeout=timeout_ms / 1000)
    try:
        description = await asyncio.wrap_future(futures[topic])
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        raise
    return len(description.partitions)


async def create_topic(admin: Admin, topic: str, partitions: int, replication_factor: int,
                       configs: dict[str, str], timeout_ms: int = 30_000) -> bool:
    """Create `topic`; False if someone else created it first (TOPIC_ALREADY_EXISTS)."""
    new_topic = NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor, config=configs)
    futures = admin.client.create_topics([new_topic], operation_timeout=timeout_ms / 1000,
                                  request_timeout=timeout_ms / 1000)
    try:
        await asyncio.wrap_future(futures[topic])
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise
    log.info("event=topic_created topic=%s partitions=%d replication_factor=%d configs=%s",
             topic, partitions, replication_factor, configs)
    return True


def state_topic_configs(config: StorageConfig, replication_factor: int) -> dict[str, str]:
    configs = {
        "cleanup.policy": "compact",
        "min.insync.replicas": str(min_insync_replicas(replication_factor)),
        "segment.bytes": str(config.segment_bytes),
        "compression.type": "producer",
    }
    configs.update(config.topic_configs)
    return configs


async def ensure_state_topic(admin: Admin, config: StorageConfig) -> None:
    """Create the compacted state topic if missing; refuse an existing one with another partition count."""
    timeout_ms = config.admin_timeout_ms
    replication_factor = config.replication_factor or min(3, await broker_count(admin, timeout_ms))
    existing = await partition_count(admin, config.state_topic, timeout_ms)
    if existing is None:
        created = await create_topic(admin, config.state_topic, config.partitions, replication_factor,
                                     state_topic_configs(config, replication_factor), timeout_ms)
        if created:
            return
        existing = await _created_elsewhere(admin, config.state_topic, timeout_ms)
    await _warn_unless_compacted(admin, config.state_topic, timeout_ms)
    if existing != config.partitions:
        raise TopicMismatchError(
            f"state topic {config.state_topic!r} has {existing} partitions but the coordinator is configured "
            f"for {config.partitions}; groups are mapped to partitions by partition_for(group_id, "
            f"{config.partitions}), so the coordinator refuses to start. Configure {existing} partitions "
            f"or use another state topic.")


async def _created_elsewhere(admin: Admin, topic: str, timeout_ms: int) -> int | None:
    """The partitions of a topic another client created as we tried to (TOPIC_ALREADY_EXISTS): the broker that
    answered our metadata request may not know of it yet, so asked again until it does, within `timeout_ms`."""
    deadline = asyncio.get_running_loop().time() + timeout_ms / 1000
    while (existing := await partition_count(admin, topic, timeout_ms)) is None:
        if asyncio.get_running_loop().time() > deadline:
            return None
        await asyncio.sleep(_METADATA_RETRY_S)
    return existing


async def _warn_unless_compacted(admin: Admin, topic: str, timeout_ms: int) -> None:
    """An existing state topic that is not compacted still works, but grows forever and loads ever slower. Only a
    warning: a topic just created by another instance may not be described yet (UNKNOWN_TOPIC_OR_PART), which
    must not stop this one from starting."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    futures = admin.client.describe_configs([resource], request_timeout=timeout_ms / 1000)
    try:
        policy = (await asyncio.wrap_future(futures[resource]))["cleanup.policy"].value
    except KafkaException as exc:
        log.info("event=state_topic_config_unknown topic=%s error=%s detail=cleanup.policy not checked",
                 topic, exc.args[0])
        return
    if "compact" not in policy:
        log.warning("event=state_topic_not_compacted topic=%s cleanup.policy=%s", topic, policy)


async def ensure_event_topic(admin: Admin, config: StorageConfig) -> None:
    """Create the (not compacted) event topic if missing; any partition count is fine."""
    timeout_ms = config.admin_timeout_ms
    if config.event_topic is None or await partition_count(admin, config.event_topic, timeout_ms) is not None:
        return
    replication_factor = config.replication_factor or min(3, await broker_count(admin, timeout_ms))
    await create_topic(admin, config.event_topic, config.event_partitions, replication_factor,
                       {"cleanup.policy": "delete",
                        "min.insync.replicas": str(min_insync_replicas(replication_factor))}, timeout_ms)
