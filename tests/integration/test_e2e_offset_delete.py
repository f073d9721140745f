"""`kafka-consumer-groups --delete-offsets` as a user meets it: Kafka's own ConsumerGroupCommand (the Java
AdminClient's deleteConsumerGroupOffsets) against `coordinator serve` on a real broker, and the deletions
surviving a restart (the tombstones reached the state topic). confluent-kafka's Python AdminClient (2.16) has
no delete_consumer_group_offsets, so the Java tool is the client here."""

from __future__ import annotations

import asyncio

import subprocess

from coordinator.embedded import ensure_jars
from tests.support.admin import admin_alter_offsets, admin_list_groups
from tests.support.kafka_tools import GROUP_COMMAND, table
from tests.support.service import FAST, commit, fetch_offsets, service, unique, until_loaded
from tests.support.wire import join_with_member_id, sync


def _delete_offsets(port: int, group_id: str, topic_partitions: str) -> dict[tuple[str, int], str]:
    """`kafka-consumer-groups --delete-offsets --group G --topic T:P,P`: per partition "Successful" or the
    exception class the tool reports."""
    command = ["java", "-cp", f"{ensure_jars()}/*", GROUP_COMMAND, "--bootstrap-server", f"127.0.0.1:{port}",
               "--delete-offsets", "--group", group_id, "--topic", topic_partitions]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = table(result.stdout)
    header = rows.index(["TOPIC", "PARTITION", "STATUS"])
    return {(row[0], int(row[1])): row[2] if row[2] == "Successful" else row[3].rsplit(".", 1)[1].rstrip(":")
            for row in rows[header + 1:]}


async def test_consumer_groups_command_deletes_offsets_and_the_deletion_survives_a_restart(
        kafka_bootstrap: str) -> None:
    state_topic = unique("__state")
    simple, emptied, live = unique("od-simple"), unique("od-emptied"), unique("od-live")
    run = asyncio.to_thread
    async with service(kafka_bootstrap, state_topic, *FAST) as running:
        probe = await running.client()
        await until_loaded(probe)
        port = running.port
        assert await run(admin_alter_offsets, port, simple, {0: 5, 1: 6, 2: 7}) == [
            (0, 5, None), (1, 6, None), (2, 7, None)]
        assert await run(admin_alter_offsets, port, emptied, {0: 9}) == [(0, 9, None)]
        # An Empty group: the listed offsets go, the others stay.
        assert await run(_delete_offsets, port, simple, "orders:0,1") == {
            ("orders", 0): "Successful", ("orders", 1): "Successful"}
        # Its last offset gone, an Empty group is removed.
        assert await run(_delete_offsets, port, emptied, "orders:0") == {("orders", 0): "Successful"}
        assert await run(_delete_offsets, port, emptied, "orders:0") == {("orders", 0): "GroupIdNotFoundException"}

        # A Stable consumer group subscribed to "orders": those offsets stay, another topic's go.
        member_client = await running.client()
        joined = await join_with_member_id(member_client, live, topics=("orders",), session_timeout_ms=60_000)
        member = joined.member_id
        assert (await sync(member_client, live, joined.generation_id, member, {member: b""})).error_code == 0
        assert await commit(member_client, live, joined.generation_id, member, {0: 11}) == [0]
        assert await commit(member_client, live, joined.generation_id, member, {0: 12}, topic="audit") == [0]
        assert await run(_delete_offsets, port, live, "orders:0") == {("orders", 0): "GroupSubscribedToTopicException"}
        assert await run(_delete_offsets, port, live, "audit:0") == {("audit", 0): "Successful"}
        assert await fetch_offsets(probe, live, (0,), topic="audit") == {0: -1}
        await member_client.close()
        await probe.close()
        assert await running.terminate() == 0

    async with service(kafka_bootstrap, state_topic, *FAST) as restarted:
        probe = await restarted.client()
        await until_loaded(probe)
        groups = await run(admin_list_groups, restarted.port)
        assert simple in groups and live in groups and emptied not in groups
        assert await fetch_offsets(probe, simple, (0, 1, 2)) == {0: -1, 1: -1, 2: 7}
        assert await fetch_offsets(probe, emptied, (0,)) == {0: -1}
        assert await fetch_offsets(probe, live, (0,)) == {0: 11}
        assert await fetch_offsets(probe, live, (0,), topic="audit") == {0: -1}
        await probe.close()
