"""Kafka's own tooling reads our state topic: the pinned Kafka jars' ConsoleConsumer with the group-metadata
and offsets formatters decodes every record we wrote to exactly the fields we wrote."""

from __future__ import annotations

import base64
import json
import subprocess
import uuid

import pytest

from coordinator.embedded import ensure_jars
from coordinator.group.records import GroupRecord, MemberRecord, OffsetRecord
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore

pytestmark = pytest.mark.integration

CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
GROUP_FORMATTER = "org.apache.kafka.tools.consumer.GroupMetadataMessageFormatter"
OFFSETS_FORMATTER = "org.apache.kafka.tools.consumer.OffsetsMessageFormatter"

MEMBERS = [
    MemberRecord("static-1-7d6e", "instance-1", "client-a", "/127.0.0.1", 300_000, 10_000, b"\x00\x01sub", b"\x00\x02"),
    MemberRecord("client-b-9f2c", None, "client-b", "/10.0.0.2", 60_000, 45_000, b"", b"\xff" * 5),
]
GROUPS = {
    "orders-service": GroupRecord("consumer", 7, "cooperative-sticky", "static-1-7d6e", 1_700_000_000_000, MEMBERS),
    "emptied": GroupRecord("consumer", 8, None, None, 1_700_000_000_500, []),
    "grüppe-😀": GroupRecord("connect", 1, "default", "client-b-9f2c", -1, MEMBERS[1:]),
}
OFFSETS = {
    "orders-service": {("orders", 0): OffsetRecord(42, 5, "checkpoint", 1_700_000_000_001),
                       ("payments", 3): OffsetRecord(0, -1, "", 1_700_000_000_002)},
    "simple": {("t", 1): OffsetRecord(43, -1, "x", 1_700_000_000_003, expire_timestamp_ms=1_700_086_400_003)},
}


def formatted(bootstrap: str, topic: str, formatter: str, record_count: int) -> list[dict]:
    jars = ensure_jars()
    command = ["java", "-cp", f"{jars}/*", CONSOLE_CONSUMER, "--bootstrap-server", bootstrap, "--topic", topic,
               "--from-beginning", "--formatter", formatter, "--max-messages", str(record_count),
               "--timeout-ms", "20000"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert f"Processed a total of {record_count} messages" in result.stderr, result.stderr[-3000:]
    return parse_json_stream(result.stdout)


def parse_json_stream(text: str) -> list[dict]:
    """The formatters print one JSON object per record without a separator (log lines may follow)."""
    decoder, documents, pos = json.JSONDecoder(), [], 0
    text = text.lstrip()
    while pos < len(text) and text[pos] == "{":
        document, pos = decoder.raw_decode(text, pos)
        documents.append(document)
    return documents


def expected_group_json(group_id: str, record: GroupRecord) -> dict:
    members = [{"memberId": m.member_id, "groupInstanceId": m.group_instance_id, "clientId": m.client_id,
                "clientHost": m.client_host, "rebalanceTimeout": m.rebalance_timeout_ms,
                "sessionTimeout": m.session_timeout_ms, "subscription": base64.b64encode(m.subscription).decode(),
                "assignment": base64.b64encode(m.assignment).decode()} for m in record.members]
    return {"key": {"type": 2, "data": {"group": group_id}},
            "value": {"version": 3, "data": {"protocolType": record.protocol_type, "generation": record.generation,
                                             "protocol": record.protocol, "leader": record.leader,
                                             "currentStateTimestamp": record.current_state_timestamp_ms,
                                             "members": members}}}


def expected_offset_json(group_id: str, topic: str, partition: int, record: OffsetRecord | None) -> dict:
    key = {"type": 1, "data": {"group": group_id, "topic": topic, "partition": partition}}
    if record is None:
        return {"key": key, "value": None}
    if record.expire_timestamp_ms is None:
        value = {"version": 3, "data": {"offset": record.offset, "leaderEpoch": record.leader_epoch,
                                        "metadata": record.metadata, "commitTimestamp": record.commit_timestamp_ms}}
    else:
        value = {"version": 1, "data": {"offset": record.offset, "metadata": record.metadata,
                                        "commitTimestamp": record.commit_timestamp_ms,
                                        "expireTimestamp": record.expire_timestamp_ms}}
    return {"key": key, "value": value}


async def test_kafka_formatters_decode_what_we_wrote(kafka_bootstrap: str) -> None:
    topic = f"__state-tools-{uuid.uuid4().hex[:8]}"
    store = KafkaGroupStore(StorageConfig(bootstrap=kafka_bootstrap, state_topic=topic, partitions=1,
                                          event_topic=None))
    await store.start()
    try:
        for group_id, record in GROUPS.items():
            await store.store_group(group_id, record)
        for group_id, offsets in OFFSETS.items():
            await store.store_offsets(group_id, offsets)
        await store.delete_offsets("orders-service", [("payments", 3)])
        await store.delete_group("emptied", [], write_group_tombstone=True)
        await store.store_offsets("simple", {})  # nothing to write: must not hang
        await store.close()  # flushes the tombstones
    finally:
        await store.close()

    record_count = len(GROUPS) + sum(map(len, OFFSETS.values())) + 2  # + two tombstones
    groups_seen = formatted(kafka_bootstrap, topic, GROUP_FORMATTER, record_count)
    expected_groups = [expected_group_json(g, r) for g, r in GROUPS.items()]
    assert groups_seen == expected_groups + [{"key": {"type": 2, "data": {"group": "emptied"}}, "value": None}]

    offsets_seen = formatted(kafka_bootstrap, topic, OFFSETS_FORMATTER, record_count)
    expected_offsets = [expected_offset_json(g, t, p, r) for g, offs in OFFSETS.items() for (t, p), r in offs.items()]
    assert offsets_seen == expected_offsets + [expected_offset_json("orders-service", "payments", 3, None)]
