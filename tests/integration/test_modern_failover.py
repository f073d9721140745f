"""A consumer group (KIP-848) in the middle of a reconciliation when the instance that owns it is SIGKILLed: two
`coordinator serve --instance-id` processes (relay on: topics from the cluster) on one state topic against the real broker, OTLP export to a real
receiver. A member has been told to revoke half its partitions for a joiner and has not acknowledged yet; the
owner dies. Both members rediscover the group's new owner as clients do (NOT_COORDINATOR, FindCoordinator) and
carry on: the revocation is acknowledged there, the joiner gets its partitions, the group is Stable at the new
epoch. The new owner finishes what the old one started: the event topic gets that epoch's rebalance_completed
(after the old owner's rebalance_started, without a duration it cannot know) and its trace of the rest of the
rebalance (resumed) ends Stable with each member's reconciliation."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from protocol.apis import ApiKey
from protocol.client import KafkaClient
from tests.support.instances import (FAST_GROUPS, NONE, TRANSIENT, Instances, connect, find_coordinator,
                                     groups_in_partitions, read_topic, unique)
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.support.polling import wait_until
from tests.support.wire import ms, nested, request

CONSUMER_GROUPS = ("group.consumer.min.heartbeat.interval.ms=500", "group.consumer.heartbeat.interval.ms=500",
                   "group.consumer.min.session.timeout.ms=10000", "group.consumer.session.timeout.ms=30000")
PARTITIONS = 6
FAILOVER_S = 90  # detection (the instance session), the instances group's rebalance, the load; a loaded machine
NOT_SERVING = {14, 15, 16}  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR
Owned = dict[uuid.UUID, tuple[int, ...]]


class Member:
    """A consumer-protocol member as a client runs it: it finds its group's coordinator and goes looking again
    when that one stops answering or says it is not the coordinator."""

    def __init__(self, cluster: Instances, group_id: str, topic: str) -> None:
        self.cluster = cluster
        self.group_id = group_id
        self.topic = topic
        self.member_id = str(uuid.uuid4())
        self.epoch = 0
        self.owned: Owned = {}
        self._client: KafkaClient | None = None

    async def _coordinator(self) -> KafkaClient:
        if self._client is not None and not self._client.is_closed:
            return self._client
        for instance in self.cluster.live():
            try:
                client = await connect(instance.address)
            except TRANSIENT:
                continue
            try:
                code, owner = await find_coordinator(client, self.group_id)
            finally:
                await client.close()
            if code == NONE and owner is not None:
                self._client = await connect(owner)
                return self._client
        raise ConnectionError(f"no coordinator for {self.group_id} yet")

    async def heartbeat(self, owned: Owned | None = None, timeout_s: float = FAILOVER_S) -> Any:
        """One heartbeat (a join at epoch 0), retried at its coordinator, wherever that is now, until answered."""
        partitions = nested(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, "topic_partitions")
        joining = self.epoch == 0
        body = request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, group_id=self.group_id, member_id=self.member_id,
                       member_epoch=self.epoch, instance_id=None, rack_id=None,
                       rebalance_timeout=ms(60_000 if joining else -1),
                       subscribed_topic_names=(self.topic,) if joining else None, subscribed_topic_regex=None,
                       server_assignor=None,
                       topic_partitions=() if joining else None if owned is None else tuple(
                           partitions(topic_id=t, partitions=ps) for t, ps in owned.items()))
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            try:
                response = await (await self._coordinator()).request(body, timeout_ms=10_000)
                if int(response.error_code) not in NOT_SERVING:
                    break
                await self._drop()
            except (*TRANSIENT, ConnectionError):
                await self._drop()
            assert asyncio.get_running_loop().time() < deadline, f"{self.member_id}: no coordinator answered"
            await asyncio.sleep(0.2)
        assert int(response.error_code) == NONE, (response.error_code, response.error_message)
        self.epoch = int(response.member_epoch)
        if response.assignment is not None:
            self.owned = {t.topic_id: tuple(sorted(t.partitions)) for t in response.assignment.topic_partitions
                          if t.partitions}
        return response

    async def _drop(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def count(self) -> int:
        return sum(len(ps) for ps in self.owned.values())


def rebalance_roots(spans: list[ReceivedSpan], group_id: str, epoch: int) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == "rebalance" and s.attributes.get("messaging.consumer.group.name") == group_id
            and s.attributes.get("coordinator.group_epoch") == epoch]


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A real OTLP receiver the instances export their spans to (they inherit the environment)."""
    otlp = OtlpReceiver().start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{otlp.endpoint}/v1/traces")
    monkeypatch.setenv("OTEL_SERVICE_NAME", unique("coordinator-failover"))
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    yield otlp
    otlp.stop()


async def test_a_reconciliation_cut_by_an_owner_sigkill_completes_on_the_new_owner(kafka_bootstrap: str,
                                                                                   receiver: OtlpReceiver) -> None:
    topic, event_topic = unique("kip848-failover"), unique("__events-kip848-failover")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    await asyncio.to_thread(lambda: admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30))
    async with Instances(kafka_bootstrap, 2, event_topic=event_topic, relay=True,
                         config=(*FAST_GROUPS, *CONSUMER_GROUPS)) as cluster:
        victim, survivor = cluster["i1"], cluster["i2"]
        ownership = await cluster.until_settled()
        [group_id] = groups_in_partitions(ownership.of(victim.instance_id), 1, cluster.partitions,
                                          unique("kip848-failover-group"))
        first, joiner = Member(cluster, group_id, topic), Member(cluster, group_id, topic)
        try:
            await first.heartbeat()

            async def owns_everything() -> bool:  # the topic may take a metadata refresh to be seen
                await first.heartbeat(dict(first.owned))
                return first.count() == PARTITIONS

            await wait_until(owns_everything, 60, "the first member owning every partition", 0.5)
            stable_epoch = first.epoch
            await joiner.heartbeat()  # the group epoch is bumped; everything it is to get is still first's
            target_epoch = joiner.epoch
            assert target_epoch == stable_epoch + 1 and joiner.count() == 0
            told = await first.heartbeat()
            assert told.assignment is not None and first.count() == PARTITIONS // 2  # revoke the other half
            assert first.epoch == stable_epoch  # not moved on until it acknowledges

            # events leave in batches: the old owner's rebalance_started must be out before it dies, or the kill
            # takes along what its producer had not sent yet
            def started_out() -> bool:
                return any(e["group_id"] == group_id and e["type"] == "rebalance_started"
                           and e["generation"] == stable_epoch for e in read_topic(kafka_bootstrap, event_topic))

            await wait_until(lambda: asyncio.to_thread(started_out), 30, "the old owner's rebalance_started", 0.5)
            await victim.kill()  # the owner dies before the acknowledgement

            await first.heartbeat(dict(first.owned))  # revoked: acknowledged at the new owner
            assert first.epoch == target_epoch

            async def joiner_served() -> bool:
                await joiner.heartbeat(dict(joiner.owned))
                return joiner.count() == PARTITIONS // 2

            await wait_until(joiner_served, 30, "the joiner getting the released partitions", 0.5)
            assert joiner.epoch == target_epoch
            assert sorted(p for m in (first, joiner) for ps in m.owned.values() for p in ps) == list(range(PARTITIONS))
            for _ in range(3):  # and both carry on there
                for member in (first, joiner):
                    await member.heartbeat()
                    assert member.epoch == target_epoch
            assert first._client is not None and first._client.address == survivor.bootstrap
        finally:
            for member in (first, joiner):
                await member._drop()

        # the event topic: the old owner started the rebalance to the target epoch, the new one completed it
        def completed() -> list[dict[str, Any]] | None:
            events = [e for e in read_topic(kafka_bootstrap, event_topic) if e["group_id"] == group_id]
            done = [e for e in events if e["type"] == "rebalance_completed" and e["generation"] == target_epoch]
            return events if done else None

        events = await wait_until(lambda: asyncio.to_thread(completed), 60, "the target epoch's rebalance_completed",
                                  0.5)
        started = [e for e in events if e["type"] == "rebalance_started" and e["generation"] == stable_epoch]
        [done] = [e for e in events if e["type"] == "rebalance_completed" and e["generation"] == target_epoch]
        assert started and started[-1]["_offset"] < done["_offset"]
        assert done["protocol"] == "consumer" and done["member_count"] == 2 and done["duration_ms"] is None
        assert done.get("trace_id"), done

        # the new owner's trace of the rest of that rebalance: resumed, Stable, each member's reconciliation
        spans = await asyncio.to_thread(receiver.wait_for, lambda s: any(
            r.attributes.get("coordinator.rebalance.resumed") for r in rebalance_roots(s, group_id, target_epoch)),
                                        60)
        [root] = [r for r in rebalance_roots(spans, group_id, target_epoch)
                  if r.attributes.get("coordinator.rebalance.resumed")]
        assert root.trace_id == done["trace_id"]
        assert root.status_code != 2, root.status_message
        assert root.attributes["coordinator.rebalance.outcome"] == "stable"
        assert root.attributes["coordinator.members.reconciled"] == 2
        members = {s.name: s for s in receiver.trace(root.trace_id) if s.parent_span_id == root.span_id}
        revoker, assigned = members[f"reconcile {first.member_id}"], members[f"reconcile {joiner.member_id}"]
        assert [e[0] for e in revoker.events] == ["partitions revoked", "epoch reached"]
        assert "assignment delivered" in [e[0] for e in assigned.events]
        assert assigned.events[-1][0] == "epoch reached"
