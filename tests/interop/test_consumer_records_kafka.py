"""Our consumer group records (types 3, 5-8, 16, tombstones) read by Kafka 4.1's own GroupCoordinatorRecordSerde (the
broker's loader and the offsets decoder of kafka-dump-log use it): each decodes to the fields we wrote, and
Kafka's re-encoding is byte for byte ours."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from coordinator.embedded import ensure_jars
from coordinator.embedded.jars import cache_root
from coordinator.group.modern.records import (CurrentAssignmentRecord, GroupEpochRecord, MemberMetadataRecord,
                                              RecordType, RegexRecord, TargetAssignmentEpochRecord,
                                              TargetAssignmentRecord,
                                              Tombstone)
from coordinator.storage.consumer_records import decode, encode_key, encode_value

pytestmark = pytest.mark.interop

SOURCE = Path(__file__).parents[1] / "support" / "java" / "ConsumerGroupRecordCheck.java"
T1, T2 = uuid.UUID("5f1a2c3e-0000-4000-8000-00000000000a"), uuid.UUID("5f1a2c3e-0000-4000-8000-00000000000b")

RECORDS = [
    GroupEpochRecord("grp", 7, metadata_hash=-1234567890123),
    GroupEpochRecord("grp", 1),
    MemberMetadataRecord("grp", "m-1", None, "rack-a", "client-1", "/127.0.0.1", ("bar", "foo"), None, 30_000,
                         "uniform"),
    MemberMetadataRecord("grp", "m-2", "instance-2", None, "client-2", "/10.0.0.2", (), "foo.*", 45_000, None),
    TargetAssignmentRecord("grp", "m-1", {T1: (0, 2, 4), T2: (1,)}),
    TargetAssignmentRecord("grp", "m-2", {}),
    TargetAssignmentEpochRecord("grp", 7),
    CurrentAssignmentRecord("grp", "m-1", 7, 6, 1, {T1: (0, 2)}, {T2: (1,)}),
    CurrentAssignmentRecord("grp", "m-2", 7, 7, 0, {}, {}),
    RegexRecord("grp", "foo.*", ("foo-1", "foo-2"), 42, 1_764_000_000_000),
    RegexRecord("grp", "nothing", (), 7, 0),
    Tombstone(RecordType.REGULAR_EXPRESSION, "grp", regex="foo.*"),
    Tombstone(RecordType.CURRENT_MEMBER_ASSIGNMENT, "grp", "m-1"),
    Tombstone(RecordType.TARGET_ASSIGNMENT_MEMBER, "grp", "m-1"),
    Tombstone(RecordType.MEMBER_METADATA, "grp", "m-1"),
    Tombstone(RecordType.TARGET_ASSIGNMENT_METADATA, "grp"),
    Tombstone(RecordType.GROUP_METADATA, "grp"),
]


def compiled() -> Path:
    jars = ensure_jars()
    digest = hashlib.sha256(SOURCE.read_bytes() + str(jars).encode()).hexdigest()[:12]
    target = cache_root() / f"record-check-{digest}"
    if not (target / "ConsumerGroupRecordCheck.class").exists():
        javac = shutil.which("javac")
        assert javac is not None, "a JDK 17+ is needed"
        staging = Path(tempfile.mkdtemp(prefix="record-check-", dir=cache_root()))
        subprocess.run([javac, "-nowarn", "-cp", f"{jars}/*", "-d", str(staging), str(SOURCE)], check=True,
                       capture_output=True, timeout=300)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


def test_kafka_reads_our_records_and_writes_the_same_bytes() -> None:
    lines = []
    for record in RECORDS:
        value = encode_value(record)
        lines.append(f"{encode_key(record).hex()} {'-' if value is None else value.hex()}")
    java = shutil.which("java")
    assert java is not None
    result = subprocess.run([java, "-cp", f"{ensure_jars()}/*:{compiled()}", "ConsumerGroupRecordCheck"],
                            input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120)
    outputs = result.stdout.splitlines()
    assert len(outputs) == len(RECORDS), result.stderr[-3000:]
    for record, sent, output in zip(RECORDS, lines, outputs):
        assert not output.startswith("ERROR"), (record, output)
        again, described = output.split("\t", 1)
        assert again == sent, (record, described)  # Kafka's re-encoding is ours, byte for byte
        key_hex, value_hex = again.split(" ")
        assert decode(bytes.fromhex(key_hex), None if value_hex == "-" else bytes.fromhex(value_hex)) == record
        if isinstance(record, GroupEpochRecord):
            assert f"epoch={record.epoch}" in described and f"metadataHash={record.metadata_hash}" in described
        if isinstance(record, MemberMetadataRecord):
            assert f"clientId='{record.client_id}'" in described and f"memberId='{record.member_id}'" in described
        if isinstance(record, CurrentAssignmentRecord):
            assert f"memberEpoch={record.member_epoch}" in described and f"state={record.state}" in described
        if isinstance(record, RegexRecord):
            assert f"version={record.version}" in described and f"regularExpression='{record.regex}'" in described
        if isinstance(record, Tombstone):
            assert "value=null" in described or "value=None" in described or described.endswith("null)"), described
