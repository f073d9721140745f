"""Kafka's own `kafka-consumer-groups` (ConsumerGroupCommand, the Java AdminClient of the pinned Kafka jars)
pointed at `coordinator serve`: listing with states, describing members, deleting a group.
(With --no-relay, describing offsets needs topic metadata and log-end offsets this coordinator does not serve:
tests/integration/test_relay_tools.py describes lag through the relay.)"""

from __future__ import annotations

import asyncio

from tests.support.kafka_tools import consumer_groups, table
from tests.support.service import commit, fetch_offsets, service, unique, until_loaded
from tests.support.wire import join_with_member_id, sync

async def test_kafka_consumer_groups_command_lists_describes_and_deletes(kafka_bootstrap: str) -> None:
    settings = ("group.initial.rebalance.delay.ms=0",)
    async with service(kafka_bootstrap, unique("__state"), *settings) as running:
        client = await running.client()
        await until_loaded(client)
        # the member sends no heartbeat: its session outlasts the three kafka-consumer-groups JVMs below (each
        # takes 10-40 s to start on a loaded 2-core machine; with 30 s it expired before --describe)
        joined = await join_with_member_id(client, "cli-app", session_timeout_ms=300_000)
        assert (await sync(client, "cli-app", joined.generation_id, joined.member_id,
                           {joined.member_id: b""})).error_code == 0
        assert await commit(client, "cli-simple", -1, "", {0: 7}) == [0]
        run = asyncio.to_thread

        listed = table(await run(consumer_groups, running.port, "--list", "--state"))
        assert sorted(listed[1:]) == [["cli-app", "Stable"], ["cli-simple", "Empty"]], listed

        members = table(await run(consumer_groups, running.port, "--describe", "--group", "cli-app", "--members"))
        assert members[0][:5] == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
        assert members[1] == ["cli-app", joined.member_id, "/127.0.0.1", "e2e-test", "0"], members

        deleted = await run(consumer_groups, running.port, "--delete", "--group", "cli-simple")
        assert "Deletion of requested consumer groups ('cli-simple') was successful." in deleted, deleted
        assert await fetch_offsets(client, "cli-simple", (0,)) == {0: -1}
        assert table(await run(consumer_groups, running.port, "--list")) == [["cli-app"]]
        await client.close()
