"""librdkafka's AdminClient (confluent-kafka) against our coordinator: offsets, groups, describe, delete. Each call
is blocking: run it in a thread from async tests."""
from __future__ import annotations

from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

TIMEOUT_S = 15


def admin_client(port: int) -> AdminClient:
    return AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "client.id": "e2e-admin"})


def admin_alter_offsets(port: int, group_id: str, offsets: dict[int, int]) -> list[tuple[int, int, Any]]:
    request = ConsumerGroupTopicPartitions(group_id, [TopicPartition("orders", p, o) for p, o in offsets.items()])
    admin = admin_client(port)  # kept referenced until the result is in: destroying it fails the request
    altered = admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT_S)[group_id].result(TIMEOUT_S)
    return [(tp.partition, tp.offset, tp.error) for tp in altered.topic_partitions]


def admin_list_offsets(port: int, group_id: str, partitions: tuple[int, ...]) -> dict[int, int]:
    request = ConsumerGroupTopicPartitions(group_id, [TopicPartition("orders", p) for p in partitions])
    admin = admin_client(port)
    result = admin.list_consumer_group_offsets([request], request_timeout=TIMEOUT_S)[group_id].result(TIMEOUT_S)
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def admin_list_groups(port: int) -> dict[str, str]:
    admin = admin_client(port)
    listed = admin.list_consumer_groups(request_timeout=TIMEOUT_S).result(TIMEOUT_S)
    return {g.group_id: g.state.name for g in listed.valid}


def admin_describe_group(port: int, group_id: str) -> Any:
    admin = admin_client(port)
    return admin.describe_consumer_groups([group_id], request_timeout=TIMEOUT_S)[group_id].result(TIMEOUT_S)


def admin_delete_group(port: int, group_id: str) -> str | None:
    try:
        admin = admin_client(port)
        admin.delete_consumer_groups([group_id], request_timeout=TIMEOUT_S)[group_id].result(TIMEOUT_S)
        return None
    except KafkaException as exc:
        return exc.args[0].name()


def alter_group_configs(bootstrap: str, group_id: str, values: dict[str, str], *, delete: tuple[str, ...] = ()
                        ) -> None:
    """Kafka's IncrementalAlterConfigs on a GROUP resource (what `kafka-configs --entity-type groups --alter` sends):
    `values` set, `delete` removed."""
    entries = [ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in values.items()]
    entries += [ConfigEntry(name, None, incremental_operation=AlterConfigOpType.DELETE) for name in delete]
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "e2e-admin"})
    resource = ConfigResource(ResourceType.GROUP, group_id, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource], request_timeout=TIMEOUT_S).values():
        future.result(TIMEOUT_S)
