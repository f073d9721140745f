"""Exactly-once consume-transform-produce loops of real clients through the coordinator (relay on), side by side
with the same loop against Kafka 4.1.1 itself: confluent-kafka's `send_offsets_to_transaction` (TxnOffsetCommit
through our handler, the offsets a transactional batch of the client's producer in our state partition, settled by
the transaction coordinator's markers), a zombie fenced by a new instance of its transactional id, a transaction
timed out by the broker, and OffsetFetch `require_stable` while a commit is pending."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition

from coordinator.embedded import ensure_jars
from coordinator.embedded.broker import die_with_parent
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from tests.support.eos_loop import (PER_TRANSACTION, RECORDS, LoopFigures, consume_transform_produce, group_offset,
                                    produce_input, read_all, read_committed_consumer, transactional_producer)
from tests.support.service import FAST, service, unique, until_loaded
from tests.support.transactions_wire import create_topic
from tests.support.wire import nested, request

pytestmark = pytest.mark.integration


@contextmanager
def _expected_loop_figures() -> Iterator[Callable[[LoopFigures], None]]:
    def check(figures: LoopFigures) -> None:
        assert figures.committed_output == [f"out-{i}" for i in range(RECORDS)]
        assert figures.uncommitted_output == RECORDS + PER_TRANSACTION  # the aborted ones are in the log
        assert figures.group_offset == RECORDS
    yield check


@pytest.mark.parametrize("cluster", ["kafka_bootstrap", "kafka_tv1"])
async def test_a_consume_transform_produce_loop_through_us_matches_kafka(request: pytest.FixtureRequest,
                                                                        cluster: str) -> None:
    """40 records, the fourth transaction aborted once: through us exactly as against Kafka itself (the committed
    output once each, the aborted one invisible read_committed, the group's offset 40), on the default (TV2)
    broker and one formatted with transaction.version=1."""
    kafka = request.getfixturevalue(cluster)
    async with service(kafka, unique("__state-eos"), *FAST, relay=True) as running:
        client = await running.client()
        try:
            await until_loaded(client)
        finally:
            await client.close()
        ours = await asyncio.to_thread(consume_transform_produce, f"127.0.0.1:{running.port}", kafka,
                                       unique("eos-group"))
        log_text = running.log_text()
    theirs = await asyncio.to_thread(consume_transform_produce, kafka, kafka, unique("eos-group"))
    with _expected_loop_figures() as check:
        check(theirs)
        check(ours)
    assert ours == LoopFigures(ours.committed_output, theirs.uncommitted_output, theirs.group_offset)
    assert "event=txn_offsets_pending" in log_text and "event=txn_offsets_committed" in log_text
    assert "event=txn_offsets_aborted" in log_text


# --- a zombie, a timeout, require_stable ------------------------------------------------------------------------

async def _stable_fetch(bootstrap: str, group: str, topic: str) -> tuple[int, Errors]:
    """OffsetFetch v7 with require_stable of partition 0, from the group's coordinator (the single broker, or
    us): the offset and the partition's error."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    client = await KafkaClient.connect(host, int(port), client_id="eos-e2e", timeout_ms=30_000)
    try:
        entry = nested(ApiKey.OFFSET_FETCH, 7, "topics")(name=topic, partition_indexes=(0,))
        response = await client.request(request(ApiKey.OFFSET_FETCH, 7, group_id=group, topics=(entry,),
                                                require_stable=True))
        assert response.error_code == 0, response
        [answer] = response.topics[0].partitions
        return int(answer.committed_offset), Errors(int(answer.error_code))
    finally:
        await client.close()


async def _offsets_sent(bootstrap: str, kafka: str, group: str, source: str, offset: int,
                        **settings: object) -> Producer:
    """A transactional producer whose open transaction holds `offset` for `group` (and one output record)."""
    def run() -> Producer:
        producer = transactional_producer(bootstrap, settings.pop("transactional_id", unique("eos-app")),  # type: ignore[arg-type]
                                  **settings)
        producer.begin_transaction()
        producer.produce(source, value=b"x", partition=0)
        metadata = read_committed_consumer(bootstrap, group)
        try:
            producer.send_offsets_to_transaction([TopicPartition(source, 0, offset)],
                                                 metadata.consumer_group_metadata(), 60)
        finally:
            metadata.close()
        return producer
    return await asyncio.to_thread(run)


async def zombie_fenced(bootstrap: str, kafka: str) -> tuple[Errors, int, int]:
    """A zombie's pending offset (10) discarded when a new instance of its transactional id starts; the new one
    commits 20. Returns what the zombie's commit raised, and the group's offset after each step."""
    group, source, transactional_id = unique("eos-zombie"), unique("eos-src"), unique("eos-app")
    create_topic(kafka, source)
    zombie = await _offsets_sent(bootstrap, kafka, group, source, 10, transactional_id=transactional_id)
    successor = await asyncio.to_thread(transactional_producer, bootstrap, transactional_id)  # fences the zombie
    after_fence = await _until_stable(bootstrap, group, source)
    try:
        await asyncio.to_thread(zombie.commit_transaction, 30)
        zombie_error = Errors.NONE
    except KafkaException as exc:
        zombie_error = Errors(exc.args[0].code()) if exc.args[0].code() > 0 else Errors.PRODUCER_FENCED
    def next_transaction() -> None:
        successor.begin_transaction()
        metadata = read_committed_consumer(bootstrap, group)
        try:
            successor.send_offsets_to_transaction([TopicPartition(source, 0, 20)], metadata.consumer_group_metadata(),
                                                  60)
        finally:
            metadata.close()
        successor.commit_transaction(60)
    await asyncio.to_thread(next_transaction)
    return zombie_error, after_fence, await _until_stable(bootstrap, group, source)


async def _until_stable(bootstrap: str, group: str, topic: str, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    while (answer := await _stable_fetch(bootstrap, group, topic))[1] == Errors.UNSTABLE_OFFSET_COMMIT:
        assert time.monotonic() < deadline, "the offset never became stable"
        await asyncio.sleep(0.1)
    assert answer[1] == Errors.NONE, answer
    return answer[0]


async def timed_out(bootstrap: str, kafka: str) -> tuple[Errors, int]:
    """A transaction holding offset 7 left open past transaction.timeout.ms: the broker aborts it. Returns
    require_stable's answer while it is open and the offset once settled (none: -1)."""
    group, source = unique("eos-timeout"), unique("eos-src")
    create_topic(kafka, source)
    await _offsets_sent(bootstrap, kafka, group, source, 7, **{"transaction.timeout.ms": 3_000})
    while_open = (await _stable_fetch(bootstrap, group, source))[1]
    return while_open, await _until_stable(bootstrap, group, source, timeout_s=90)


async def require_stable_waits(bootstrap: str, kafka: str) -> tuple[tuple[int, Errors], int, int]:
    """Offset 5 committed, then 9 sent in an open transaction: require_stable answers UNSTABLE_OFFSET_COMMIT; a
    read_committed confluent-kafka consumer's committed() (which asks it) returns 9 once the transaction
    commits. Returns the raw answer while open, committed()'s answer, and the offset after."""
    group, source = unique("eos-stable"), unique("eos-src")
    create_topic(kafka, source)
    first = await _offsets_sent(bootstrap, kafka, group, source, 5)
    await asyncio.to_thread(first.commit_transaction, 60)
    producer = await _offsets_sent(bootstrap, kafka, group, source, 9)
    while_open = await _stable_fetch(bootstrap, group, source)
    reader = read_committed_consumer(bootstrap, group)
    try:
        asked = asyncio.ensure_future(asyncio.to_thread(reader.committed, [TopicPartition(source, 0)], 60))
        await asyncio.sleep(0)  # asked while the transaction is open: librdkafka retries UNSTABLE_OFFSET_COMMIT
        await asyncio.to_thread(producer.commit_transaction, 60)
        [committed] = await asyncio.wait_for(asked, 90)
    finally:
        reader.close()
    return while_open, committed.offset, await _until_stable(bootstrap, group, source)


@pytest.mark.parametrize("cluster", ["kafka_bootstrap", "kafka_tv1"])
async def test_zombie_timeout_and_require_stable_through_us_match_kafka(request: pytest.FixtureRequest,
                                                                        cluster: str) -> None:
    kafka = request.getfixturevalue(cluster)
    async with service(kafka, unique("__state-eos"), *FAST, relay=True) as running:
        client = await running.client()
        try:
            await until_loaded(client)
        finally:
            await client.close()
        us = f"127.0.0.1:{running.port}"
        ours = (await zombie_fenced(us, kafka), await timed_out(us, kafka), await require_stable_waits(us, kafka))
    theirs = (await zombie_fenced(kafka, kafka), await timed_out(kafka, kafka),
              await require_stable_waits(kafka, kafka))
    zombie, timeout, stable = theirs
    assert zombie[1:] == (-1, 20), zombie  # the zombie's 10 never visible, the successor's 20 committed
    assert zombie[0] != Errors.NONE  # its commit fails: fenced
    assert timeout == (Errors.UNSTABLE_OFFSET_COMMIT, -1)  # pending while open, aborted by the broker
    assert stable == ((-1, Errors.UNSTABLE_OFFSET_COMMIT), 9, 9)
    assert ours == theirs


# --- the Java client (KIP-447 group metadata) ------------------------------------------------------------------

JAVA_LOOP = Path(__file__).parents[1] / "support" / "java" / "TxnLoop.java"
JAVA_LOG_CONFIG = Path(__file__).parents[1] / "support" / "java" / "log4j2.properties"


def java_loop(bootstrap: str, kafka: str) -> dict[str, list[str]]:
    """TxnLoop.java (Kafka's own 4.1.1 clients) over RECORDS input records; its stdout lines by their first word."""
    group, source, sink = unique("eos-java"), unique("eos-in"), unique("eos-out")
    create_topic(kafka, source)
    create_topic(kafka, sink)
    produce_input(kafka, source)
    command = [shutil.which("java") or "java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               f"-Dlog4j2.configurationFile={JAVA_LOG_CONFIG}", "-cp", f"{ensure_jars()}/*", str(JAVA_LOOP),
               bootstrap, group, source, sink, str(RECORDS), unique("eos-java-app")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240,
                          preexec_fn=die_with_parent)  # noqa: PLW1509 (the JVM must not outlive the test)
    assert done.returncode == 0, done.stderr[-3000:]
    lines: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        word, _, rest = line.partition(" ")
        lines.setdefault(word, []).append(rest)
    lines["OUTPUT"] = read_all(kafka, sink, "read_committed", RECORDS)
    lines["GROUP_OFFSET"] = [str(group_offset(bootstrap, group, source))]
    return lines


_RETRIED = {"CONCURRENT_TRANSACTIONS", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR"}


@pytest.mark.parametrize("cluster", ["kafka_bootstrap", "kafka_tv1"])
async def test_the_java_client_sends_offsets_with_its_group_metadata(request: pytest.FixtureRequest,
                                                                     cluster: str) -> None:
    """sendOffsetsToTransaction(offsets, consumer.groupMetadata()) of a subscribed classic member: committed as
    against Kafka; with a stale generation or an unknown member id the same exceptions as Kafka's."""
    kafka = request.getfixturevalue(cluster)
    async with service(kafka, unique("__state-eos"), *FAST, relay=True) as running:
        client = await running.client()
        try:
            await until_loaded(client)
        finally:
            await client.close()
        ours = await asyncio.to_thread(java_loop, f"127.0.0.1:{running.port}", kafka)
        log_text = running.log_text()
    theirs = await asyncio.to_thread(java_loop, kafka, kafka)
    assert theirs["OUTPUT"] == [f"out-{i}" for i in range(RECORDS)] and theirs["GROUP_OFFSET"] == [str(RECORDS)]
    assert theirs["STALE"] == ["CommitFailedException"], theirs
    assert theirs["UNKNOWN_MEMBER"] == ["CommitFailedException"], theirs
    for word in ("OUTPUT", "GROUP_OFFSET", "STALE", "UNKNOWN_MEMBER", "DONE"):
        assert ours[word] == theirs[word], (word, ours[word], theirs[word])
    assert ours["COMMITTED"][-1] == str(RECORDS)
    refusals = [line for line in log_text.splitlines() if "event=txn_offset_commit_refused" in line]
    # a loaded machine adds retriable refusals the client retries (the previous EndTxn's markers still being
    # written): the final ones are what the application saw
    final = [error for error in (line.rsplit("error=", 1)[1] for line in refusals) if error not in _RETRIED]
    assert final == ["ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID"], refusals
    # our ApiVersions carries the cluster's finalized transaction.version: on a TV2 cluster the Java producer
    # sends no AddOffsetsToTxn and TxnOffsetCommit v5 (our Produce v12 adds the state partition), on TV1 v4
    tv2 = cluster == "kafka_bootstrap"
    pending = [line for line in log_text.splitlines() if "event=txn_offsets_pending" in line]
    served = {line.split(" version=", 1)[1].split()[0] for line in refusals + pending}
    assert served == ({"5"} if tv2 else {"4"}), served
    added = [line for line in log_text.splitlines() if "event=state_partition_added" in line]
    assert (len(added) == 0) if tv2 else (len(added) >= len(pending) > 0), (len(added), len(pending))
