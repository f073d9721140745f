"""The differential harness of KIP-848: scripted ConsumerGroupHeartbeat (v1) and ConsumerGroupDescribe sequences
replayed against Kafka 4.1.1's own group coordinator (an embedded broker) and ours (relaying to that broker, so the
topic ids are the same), every answer and describe snapshot compared: join, leave, session expiry, revocation
timeout, static rejoin, regex, subscription change, epoch validation and request validation."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from coordinator.embedded import EmbeddedKafka
from protocol.apis import ApiKey
from tests.support.admin import alter_group_configs
from tests.support.consumer_group_differential import Pair, Side, close, connect
from tests.support.relay import create_topic
from tests.support.polling import wait_until
from tests.support.service import service, unique
from tests.support.wire import nested

pytestmark = pytest.mark.interop

SETTINGS = {"group.consumer.min.session.timeout.ms": "2000", "group.consumer.session.timeout.ms": "4000",
            "group.consumer.min.heartbeat.interval.ms": "500", "group.consumer.heartbeat.interval.ms": "1000"}
TOPIC6, TOPIC3, REGEX_TOPIC = unique("diff6"), unique("diff3"), unique("diffre")
TIMEOUT_S = 60
STABLE = "Stable"
BAD_REGEXES = ("[unclosed", "(abc", "abc)", "a**", "x{1001}", "\\", "\\q", "[z-a]", "*a", "(?=x)", "(?i",
               "[[:foo:]]", "\\pX", "x{2,1}")


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedKafka]:
    kafka = EmbeddedKafka(extra_properties={**SETTINGS, "offsets.topic.num.partitions": "1"})
    kafka.start_blocking()
    try:
        create_topic(kafka.bootstrap, TOPIC6, 6)
        create_topic(kafka.bootstrap, TOPIC3, 3)
        yield kafka
    finally:
        kafka.stop_blocking()
        kafka.remove_data()


@asynccontextmanager
async def both(broker: EmbeddedKafka) -> AsyncIterator[Pair]:
    host, port = broker.bootstrap.rsplit(":", 1)
    settings = [f"{name}={value}" for name, value in SETTINGS.items()]
    state_topic = unique("__state")
    async with service(broker.bootstrap, state_topic, *settings, "offsets.topic.num.partitions=1",
                       relay=True) as running:
        kafka = await connect(host, int(port), "probe")
        ours = await connect("127.0.0.1", running.port, "probe")
        try:
            pair = Pair(Side("Kafka", kafka), Side("ours", ours), bootstrap=broker.bootstrap, state_topic=state_topic,
                        ours_bootstrap=f"127.0.0.1:{running.port}")
            await pair.ready("probe", TIMEOUT_S)  # one partition on each side: every group is served
            yield pair
        finally:
            await close(kafka, ours)


def member(name: str) -> str:
    """A v1 member id: the client makes it (a UUID), the same on both sides."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, name))


def members_of(snapshot: tuple[Any, ...]) -> dict[str, tuple[Any, ...]]:
    return {m[0]: m for m in snapshot[6]}


def _topics_sorted(response: Any) -> Any:
    return dataclasses.replace(response, groups=tuple(
        dataclasses.replace(g, topics=tuple(sorted(g.topics, key=lambda t: t.name))) for g in response.groups))


def assigned_count(snapshot: tuple[Any, ...], member_id: str) -> int:
    """How many partitions the member holds (0 if it is not in the group)."""
    found = members_of(snapshot).get(member_id)
    return 0 if found is None else sum(len(ps) for _, ps in found[8])


async def test_join_reconcile_and_leave(broker: EmbeddedKafka) -> None:
    group, a, b = unique("diff-join"), member("join-a"), member("join-b")
    async with both(broker) as pair:
        await pair.describe(group)  # GROUP_ID_NOT_FOUND, same message
        first = await pair.heartbeat(group, a, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={})
        assert first.member_epoch == 1 and first.assignment and sum(len(p) for _, p in first.assignment) == 6
        await pair.describe(group)
        await pair.heartbeat(group, a, 1, owned=first.owned())  # nothing new: no assignment sent
        joined = await pair.heartbeat(group, b, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={})
        assert joined.member_epoch == 2
        await pair.describe(group)  # b waits for what a must revoke
        revoking = await pair.heartbeat(group, a, 1, owned=first.owned())
        await pair.describe(group)
        done = await pair.heartbeat(group, a, revoking.member_epoch, owned=revoking.owned())
        b_now = await pair.heartbeat(group, b, joined.member_epoch, owned=joined.owned())
        snapshot = await pair.describe(group)
        assert snapshot[2] == STABLE, snapshot
        # the previous epoch with a subset of what the member holds (a lost response); a member reporting
        # partitions it was never given
        await pair.heartbeat(group, a, revoking.member_epoch, owned=done.owned())
        await pair.heartbeat(group, b, b_now.member_epoch, owned=first.owned())
        await pair.heartbeat(group, a, done.member_epoch, owned=done.owned())
        await pair.heartbeat(group, a, -1)  # leaves
        await pair.describe(group)
        await pair.heartbeat(group, b, b_now.member_epoch, owned=b_now.owned())
        await pair.describe(group)
        assert len(await pair.same_records(group)) > 10


async def test_epoch_and_request_validation(broker: EmbeddedKafka) -> None:
    group, a = unique("diff-valid"), member("valid-a")
    async with both(broker) as pair:
        await pair.heartbeat(group, "", 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={})  # v1: no id
        await pair.heartbeat(group, a, 0, topics=(TOPIC6,), owned={})  # no rebalance timeout
        await pair.heartbeat(group, a, 0, rebalance_timeout_ms=30_000, owned={})  # nothing subscribed
        await pair.heartbeat(group, a, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000)  # no owned partitions
        await pair.heartbeat(group, a, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={},
                             server_assignor="nope")
        for bad in BAD_REGEXES:  # RE2/J's descriptions in the message
            await pair.heartbeat(group, a, 0, rebalance_timeout_ms=30_000, owned={}, regex=bad)
        await pair.heartbeat(group, a, -3, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={})
        await pair.heartbeat(group, a, 5)  # unknown member
        joined = await pair.heartbeat(group, a, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={})
        await pair.heartbeat(group, a, joined.member_epoch + 1, owned=joined.owned())  # from the future: fenced
        await pair.heartbeat(group, a, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={})  # rejoin
        await pair.heartbeat(group, member("valid-x"), 1, owned={})  # unknown member at an epoch
        await pair.heartbeat(group, a, -2)  # dynamic member leaving "temporarily"
        await pair.describe(group)


async def test_static_member_rejoins_and_gets_its_partitions_back(broker: EmbeddedKafka) -> None:
    group, a, b, a2 = unique("diff-static"), member("static-a"), member("static-b"), member("static-a2")
    async with both(broker) as pair:
        first = await pair.heartbeat(group, a, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={},
                                     instance_id="i-a")
        other = await pair.heartbeat(group, b, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={},
                                     instance_id="i-b")
        kept = await pair.heartbeat(group, a, first.member_epoch, owned=first.owned())
        a_epoch = (await pair.heartbeat(group, a, kept.member_epoch, owned=kept.owned())).member_epoch
        await pair.heartbeat(group, b, other.member_epoch, owned=other.owned())
        # another member with a's instance id while a is active: refused
        await pair.heartbeat(group, a2, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={},
                             instance_id="i-a")
        await pair.heartbeat(group, a, -2, instance_id="i-a")  # leaves for now (a restart)
        await pair.describe(group)
        back = await pair.heartbeat(group, a2, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={},
                                    instance_id="i-a")
        assert back.member_epoch == a_epoch and back.assignment
        await pair.describe(group)
        await pair.heartbeat(group, a2, -1, instance_id="i-a")  # leaves for good
        await pair.describe(group)
        await pair.same_records(group)


async def test_subscription_change(broker: EmbeddedKafka) -> None:
    group, a, b = unique("diff-sub"), member("sub-a"), member("sub-b")
    async with both(broker) as pair:
        a1 = await pair.heartbeat(group, a, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={})
        b1 = await pair.heartbeat(group, b, 0, topics=(TOPIC3,), rebalance_timeout_ms=30_000, owned={})
        a2 = await pair.heartbeat(group, a, a1.member_epoch, topics=(TOPIC6, TOPIC3), owned=a1.owned())
        await pair.describe(group)
        b2 = await pair.heartbeat(group, b, b1.member_epoch, owned=b1.owned())
        a3 = await pair.heartbeat(group, a, a2.member_epoch, owned=a2.owned())
        await pair.heartbeat(group, b, b2.member_epoch, owned=b2.owned())
        await pair.heartbeat(group, a, a3.member_epoch, owned=a3.owned())
        await pair.heartbeat(group, a, a3.member_epoch, regex="", owned=a3.owned())  # "": no regex, as before
        await pair.describe(group)
        await pair.heartbeat(group, b, b2.member_epoch, topics=(), owned=b2.owned())  # subscribes to nothing
        await pair.describe(group)
        await pair.same_records(group)


async def test_regex_subscription_picks_up_a_new_topic(broker: EmbeddedKafka) -> None:
    group, a = unique("diff-regex"), member("regex-a")
    regex = f"{REGEX_TOPIC}-.*"
    await asyncio.to_thread(create_topic, broker.bootstrap, f"{REGEX_TOPIC}-1", 2)
    async with both(broker) as pair:
        joined = await pair.heartbeat(group, a, 0, regex=regex, rebalance_timeout_ms=30_000, owned={})
        resolved = await pair.converge(group, lambda s: s[3] >= 2 and s[4] >= 2 and s[2] == STABLE, TIMEOUT_S,
                                       "the regex resolved", keep_alive=(a,))
        assert assigned_count(resolved, a) == 2, resolved
        await asyncio.to_thread(create_topic, broker.bootstrap, f"{REGEX_TOPIC}-2", 3)
        grown = await pair.converge(group, lambda s: assigned_count(s, a) == 5, TIMEOUT_S,
                                    "the new topic assigned", keep_alive=(a,))
        assert grown[2] == STABLE and joined.member_epoch == 1
        await pair.same_records(group)


async def test_session_expiry_fences_a_silent_member(broker: EmbeddedKafka) -> None:
    group, a, b = unique("diff-session"), member("session-a"), member("session-b")
    async with both(broker) as pair:
        a1 = await pair.heartbeat(group, a, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={})
        await pair.heartbeat(group, b, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={})
        await pair.heartbeat(group, a, a1.member_epoch, owned=a1.owned())
        # a goes silent; b keeps heartbeating until a's session (4 s) runs out on each side
        after = await pair.converge(group, lambda s: a not in members_of(s) and s[2] == STABLE, TIMEOUT_S,
                                    "a fenced at its session timeout", keep_alive=(b,))
        assert assigned_count(after, b) == 6
        await pair.heartbeat(group, a, a1.member_epoch, owned=a1.owned())  # the fenced member hears it
        await pair.same_records(group)


async def test_revocation_timeout_fences_a_member_that_keeps_its_partitions(broker: EmbeddedKafka) -> None:
    group, a, b = unique("diff-revoke"), member("revoke-a"), member("revoke-b")
    async with both(broker) as pair:
        a1 = await pair.heartbeat(group, a, 0, topics=(TOPIC6,), rebalance_timeout_ms=1_500, owned={})
        b1 = await pair.heartbeat(group, b, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={})
        revoke = await pair.heartbeat(group, a, a1.member_epoch, owned=a1.owned())  # told to revoke
        assert revoke.assignment is not None

        # a keeps heartbeating with everything it owned (never revokes): fenced at its rebalance timeout; both
        # sides hear the same heartbeats in the same order meanwhile
        fenced: set[str] = set()

        async def both_fenced() -> bool:
            for side in pair.sides:
                if side.name not in fenced:
                    if (await side.heartbeat(group, a, a1.member_epoch, owned=a1.owned())).error != 0:
                        fenced.add(side.name)
                    await side.heartbeat(group, b, b1.member_epoch, owned={})
            return len(fenced) == len(pair.sides)

        await wait_until(both_fenced, TIMEOUT_S, "a fenced at its rebalance timeout on both sides", interval_s=0.3)
        await pair.heartbeat(group, a, a1.member_epoch, owned=a1.owned())  # both say how it is fenced now
        await pair.describe(group)
        await pair.same_records(group)


async def test_offsets_and_deletion_of_a_consumer_group(broker: EmbeddedKafka) -> None:
    group, a = unique("diff-delete"), member("delete-a")
    commit_topic = nested(ApiKey.OFFSET_COMMIT, 9, "topics")
    commit_partition = nested(ApiKey.OFFSET_COMMIT, 9, "topics", "partitions")
    delete_topic = nested(ApiKey.OFFSET_DELETE, 0, "topics")
    delete_partition = nested(ApiKey.OFFSET_DELETE, 0, "topics", "partitions")
    fetch_group = nested(ApiKey.OFFSET_FETCH, 9, "groups")

    async def commit(member_id: str, epoch: int, *topics: str) -> None:
        await pair.same(ApiKey.OFFSET_COMMIT, 9, group_id=group, generation_id_or_member_epoch=epoch,
                        member_id=member_id, group_instance_id=None, topics=tuple(
                            commit_topic(name=t, partitions=(commit_partition(
                                partition_index=0, committed_offset=11, committed_leader_epoch=-1,
                                committed_metadata="m"),)) for t in topics))

    async def delete_offsets(*topics: str) -> None:
        await pair.same(ApiKey.OFFSET_DELETE, 0, group_id=group, topics=tuple(
            delete_topic(name=t, partitions=(delete_partition(partition_index=0),
                                             delete_partition(partition_index=1))) for t in topics))

    async def fetch(member_id: str | None, epoch: int) -> None:
        # every offset of the group: Kafka lists the topics in its hash map's order, which no client relies on
        await pair.same(ApiKey.OFFSET_FETCH, 9, groups=(fetch_group(group_id=group, member_id=member_id,
                                                                    member_epoch=epoch, topics=None),),
                        require_stable=False, normalize=_topics_sorted)

    async def delete_group() -> None:
        await pair.same(ApiKey.DELETE_GROUPS, 2, groups_names=(group,))

    async with both(broker) as pair:
        joined = await pair.heartbeat(group, a, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={})
        await commit(a, joined.member_epoch + 1, TOPIC6)  # stale epoch
        await commit(member("delete-x"), joined.member_epoch, TOPIC6)  # unknown member
        await commit(a, joined.member_epoch, TOPIC6, TOPIC3)
        await fetch(a, joined.member_epoch)
        await fetch(a, joined.member_epoch - 1)
        await fetch(None, -1)
        await delete_offsets(TOPIC6, TOPIC3)  # TOPIC6 subscribed: kept; TOPIC3 deleted
        await fetch(None, -1)
        await delete_group()  # a member: NON_EMPTY_GROUP
        await pair.heartbeat(group, a, joined.member_epoch, owned=joined.owned())
        await pair.heartbeat(group, a, -1)
        await commit("", -1, TOPIC3)  # an empty group takes an admin's commit
        await delete_offsets(TOPIC6)  # nobody subscribes any more
        await fetch(None, -1)
        await delete_group()
        await pair.describe(group)
        await fetch(None, -1)
        await delete_group()  # gone: GROUP_ID_NOT_FOUND
        await delete_offsets(TOPIC3)
        await pair.same_records(group)  # the deletion's tombstones in the same order


async def test_assignors_racks_missing_topics_and_other_group_apis(broker: EmbeddedKafka) -> None:
    group, a, b, c = unique("diff-assign"), member("assign-a"), member("assign-b"), member("assign-c")
    later = unique("diff-later")
    async with both(broker) as pair:
        a1 = await pair.heartbeat(group, a, 0, topics=(TOPIC6, TOPIC3), rebalance_timeout_ms=30_000, owned={},
                                  server_assignor="range", rack_id="r1")
        b1 = await pair.heartbeat(group, b, 0, topics=(TOPIC6, later), rebalance_timeout_ms=30_000, owned={},
                                  server_assignor="range", rack_id="r2")
        c1 = await pair.heartbeat(group, c, 0, topics=(TOPIC3,), rebalance_timeout_ms=30_000, owned={},
                                  server_assignor="uniform")
        await pair.describe(group)  # range: the most common assignor
        a2 = await pair.heartbeat(group, a, a1.member_epoch, owned=a1.owned())
        b2 = await pair.heartbeat(group, b, b1.member_epoch, owned=b1.owned())
        c2 = await pair.heartbeat(group, c, c1.member_epoch, owned=c1.owned())
        a3 = await pair.heartbeat(group, a, a2.member_epoch, owned=a2.owned())
        await pair.describe(group)
        await pair.heartbeat(group, b, b2.member_epoch, owned=b2.owned(), server_assignor="uniform")
        await pair.heartbeat(group, c, c2.member_epoch, owned=c2.owned())
        await pair.heartbeat(group, a, a3.member_epoch, owned=a3.owned())
        await pair.heartbeat(group, a, a3.member_epoch, regex="", owned=a3.owned())  # "": no regex, as before
        await pair.describe(group)
        # records up to here; after the topic appears, when each side bumps the epoch relative to the keep-alive
        # heartbeats is timing (Kafka sees its metadata image at once, we refresh), and so are the targets
        await pair.same_records(group)
        await asyncio.to_thread(create_topic, broker.bootstrap, later, 2)  # b's missing topic appears
        await pair.converge(group, lambda s: s[2] == STABLE and sum(assigned_count(s, m) for m in (a, b, c)) == 11,
                            TIMEOUT_S, "the new topic assigned", keep_alive=(a, b, c))
        # the classic APIs on a consumer group, and ours on a classic-free group id
        await pair.same(ApiKey.DESCRIBE_GROUPS, 5, groups=(group,), include_authorized_operations=False)
        await pair.heartbeat(group, a, -1)
        await pair.heartbeat(group, b, -1)
        await pair.heartbeat(group, c, -1)
        await pair.describe(group)


async def test_the_group_apis_are_advertised_with_kafkas_versions(broker: EmbeddedKafka) -> None:
    """OffsetCommit 2-9 and OffsetFetch 1-9 on both: Kafka 4.1.1 does not serve v10 (topic ids) either."""
    group_apis = (ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.DELETE_GROUPS, ApiKey.OFFSET_DELETE,
                  ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.CONSUMER_GROUP_DESCRIBE)
    async with both(broker) as pair:
        kafka, ours = [await side.client.negotiate_versions() for side in pair.sides]
        assert {k: ours.get(k) for k in group_apis} == {k: kafka.get(k) for k in group_apis}
        assert kafka[ApiKey.OFFSET_COMMIT] == (2, 9) and kafka[ApiKey.OFFSET_FETCH] == (1, 9)


async def test_group_configs_set_on_the_cluster(broker: EmbeddedKafka) -> None:
    """consumer.session.timeout.ms / consumer.heartbeat.interval.ms set on one group (Kafka's
    IncrementalAlterConfigs, as kafka-configs --entity-type groups sends it): both coordinators give its members the
    group's interval and fence them at the group's session timeout (2 s, the coordinators' own being 4 s); an
    alteration through our relay reaches our members' next heartbeats at once (not at the 10 s refresh)."""
    group, a, b = unique("diff-config"), member("config-a"), member("config-b")
    await asyncio.to_thread(alter_group_configs, broker.bootstrap, group,
                            {"consumer.session.timeout.ms": "2000", "consumer.heartbeat.interval.ms": "600"})
    async with both(broker) as pair:
        a1 = await pair.heartbeat(group, a, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={})
        assert a1.heartbeat_interval_ms == 600
        await pair.heartbeat(group, b, 0, topics=(TOPIC6,), rebalance_timeout_ms=30_000, owned={})
        a2 = await pair.heartbeat(group, a, a1.member_epoch, owned=a1.owned())
        silent_since = time.monotonic()  # a goes silent; b keeps heartbeating
        after = await pair.converge(group, lambda s: a not in members_of(s) and s[2] == STABLE, TIMEOUT_S,
                                    "a fenced at its group's session timeout", keep_alive=(b,))
        fenced_after_s = time.monotonic() - silent_since
        assert fenced_after_s < 3.9, f"a was fenced {fenced_after_s:.1f} s after its last heartbeat"
        assert assigned_count(after, b) == 6
        await pair.heartbeat(group, a, a2.member_epoch, owned=a2.owned())  # fenced on both sides

        await asyncio.to_thread(alter_group_configs, pair.ours_bootstrap, group,
                                {"consumer.heartbeat.interval.ms": "800"}, delete=("consumer.session.timeout.ms",))
        altered_at = time.monotonic()
        snapshot = members_of(after)[b]
        owned = {t: tuple(sorted(ps)) for t, ps in snapshot[8]}

        async def both_give_the_new_interval() -> bool:
            answers = [await side.heartbeat(group, b, snapshot[3], owned=owned) for side in pair.sides]
            return all(answer.heartbeat_interval_ms == 800 for answer in answers)

        await wait_until(both_give_the_new_interval, TIMEOUT_S, "the altered interval on both sides", interval_s=0.1)
        assert time.monotonic() - altered_at < 5, "the alteration reached our members only at the refresh"
        assert (await pair.heartbeat(group, b, snapshot[3], owned=owned)).heartbeat_interval_ms == 800
        await pair.same_records(group)
