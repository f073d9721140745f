"""An OffsetCommit is all or nothing, as in Kafka, where a commit is one record batch and a batch larger than
max.message.bytes fails as a whole (MESSAGE_TOO_LARGE → INVALID_COMMIT_OFFSET_SIZE for every partition).
A write spread over several produce requests could be stored in part — and a restarted coordinator would find
that part — so a write that cannot be one batch is refused before anything is sent."""

from __future__ import annotations

from protocol.apis import ApiKey
from protocol.client import KafkaClient
from tests.support.service import fetch_offsets, service, unique, until_loaded
from tests.support.wire import nested, request

INVALID_COMMIT_OFFSET_SIZE = 28
GROUP = "atomic-tool"
BIG_METADATA = "x" * 20_000
PARTITIONS = 100  # 100 × 20 KB: about 2 MB, beyond one batch (Kafka's max.message.bytes, librdkafka's 1 MB)
SETTINGS = ("offset.metadata.max.bytes=30000",)  # the per-partition limit lets each one through


async def commit_with_metadata(client: KafkaClient, offsets: dict[int, tuple[int, str]]) -> list[int]:
    partition = nested(ApiKey.OFFSET_COMMIT, 8, "topics", "partitions")
    topic = nested(ApiKey.OFFSET_COMMIT, 8, "topics")(name="orders", partitions=tuple(
        partition(partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata=m)
        for p, (o, m) in offsets.items()))
    response = await client.request(request(ApiKey.OFFSET_COMMIT, 8, group_id=GROUP, generation_id_or_member_epoch=-1,
                                            member_id="", group_instance_id=None, topics=(topic,)))
    return [p.error_code for t in response.topics for p in t.partitions]


async def test_a_commit_too_large_for_one_batch_stores_none_of_it(kafka_bootstrap: str) -> None:
    state_topic = unique("__state")
    async with service(kafka_bootstrap, state_topic, *SETTINGS) as running:
        client = await running.client()
        await until_loaded(client)
        assert await commit_with_metadata(client, {0: (5, "first")}) == [0]
        errors = await commit_with_metadata(client, {p: (6, BIG_METADATA) for p in range(PARTITIONS)})
        assert errors == [INVALID_COMMIT_OFFSET_SIZE] * PARTITIONS, set(errors)
        assert await fetch_offsets(client, GROUP, (0, 1, 2)) == {0: 5, 1: -1, 2: -1}
        assert await commit_with_metadata(client, {p: (9, BIG_METADATA) for p in range(3)}) == [0, 0, 0]
        await client.close()
        assert await running.terminate() == 0

    async with service(kafka_bootstrap, state_topic, *SETTINGS) as restarted:
        client = await restarted.client()
        await until_loaded(client)
        assert await fetch_offsets(client, GROUP, (0, 1, 2, 3, 99)) == {0: 9, 1: 9, 2: 9, 3: -1, 99: -1}
        await client.close()
