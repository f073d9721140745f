"""Three coordinator instances on one state topic (issue 10, step 2), black-box: `coordinator serve --instance-id`
subprocesses against the real broker, protocol-level members that rediscover like real clients
(coordinator/loadgen), stock consumers through the relay; ownership read from the instances' own consumer group.

- SIGKILL one instance: its partitions move, its groups are loaded by the others, its members rediscover and carry
  on in the same generation; every group is served again within a failover; no acknowledged offset is lost; no
  group is served by two instances (event topic, instances' logs).
- SIGSTOP one past its instance session, then SIGCONT: requests it finds waiting when it wakes are answered
  NOT_COORDINATOR, nothing it no longer owns is expired, written or rebalanced, and the state stays consistent.
- Rolling restart of all three with confluent-kafka and aiokafka consumers through the relay: consumption never
  stops longer than one failover and no committed offset goes backwards.
"""

from __future__ import annotations

import asyncio
import collections
import re
import threading
import time
from typing import Any

from coordinator.loadgen.member import SimMember
from coordinator.loadgen.simulation import SimOptions, Simulation
from tests.support.instances import (INSTANCE_SESSION_MS, NONE, NOT_COORDINATOR, TRANSIENT, Instance, Instances,
                                     Ownership, committed_offsets, connect, describe_groups, describe_request,
                                     find_coordinator, groups_in_partitions, read_topic, unique)
from tests.support.polling import wait_until
from tests.support.service import commit, fetch_offsets
from tests.support.wire import heartbeat

GROUPS_PER_INSTANCE = 20
MEMBERS = 2
MEMBER_SESSION_MS = 20_000
# Detection (the instance session), the instances group's rebalance, fencing and loading the partitions, the
# members' rediscovery: 7.7-8.6 s measured at load average 10-20 on 2 cores; the margin is for worse.
ONE_FAILOVER_S = INSTANCE_SESSION_MS / 1000 + 30
FORM_TIMEOUT_S = 120
ACKED_TOPIC = "acked"
GROUP_LOADED = re.compile(r"event=group_loaded group=(\S+) ")
MEMBER_FAILED = re.compile(r"Member \S+ in group (\S+) has failed, removing it from the group")
GROUP_ACTIVITY = re.compile(
    r"event=(?:group_stabilized|rebalance_complete|rebalance_prepare|member_added) group=(\S+) ")


# ---------------------------------------------------------------------------------------------------- helpers

def spread_groups(cluster: Instances, ownership: Ownership, per_instance: int, prefix: str) -> dict[str, list[str]]:
    """instance id -> group ids whose partitions it owns now."""
    return {i.instance_id: groups_in_partitions(ownership.of(i.instance_id), per_instance, cluster.partitions,
                                                f"{prefix}-{i.instance_id}") for i in cluster}


async def start_members(cluster: Instances, entry: Instance, groups: list[str], session_ms: int) -> Simulation:
    """MEMBERS protocol-level consumers per group, bootstrapped at `entry` then the others (they follow
    FindCoordinator to each group's owner), all Stable."""
    others = tuple(i.address for i in cluster if i is not entry)
    sim = Simulation(SimOptions(coordinator=entry.address, more_coordinators=others, named_groups=tuple(groups),
                                members=MEMBERS, topic="orders", partitions=6, session_ms=session_ms,
                                rebalance_ms=30_000, heartbeat_ms=1_000, commit_interval_ms=2_000,
                                request_timeout_ms=10_000))
    sim.start_members()
    try:
        await wait_until(sim.all_stable, FORM_TIMEOUT_S, f"{len(groups)} groups of {MEMBERS} members Stable", 0.25)
    except BaseException:
        await sim.close()
        raise
    return sim


def members_by_group(sim: Simulation) -> dict[str, list[SimMember]]:
    grouped: dict[str, list[SimMember]] = collections.defaultdict(list)
    for member in sim.members:
        grouped[member.group_id].append(member)
    return grouped


async def described_at_owners(cluster: Instances, ownership: Ownership, groups: list[str]) -> dict[str, Any]:
    """DescribeGroups of every group, asked of the instance that owns its partition."""
    by_owner: dict[str, list[str]] = collections.defaultdict(list)
    for group_id in groups:
        by_owner[ownership.owners[cluster.partition_of(group_id)]].append(group_id)
    described: dict[str, Any] = {}
    for owner, group_ids in by_owner.items():
        client = await connect(cluster[owner].address)
        try:
            described.update(await describe_groups(client, group_ids))
        finally:
            await client.close()
    return described


async def groups_carried_on(cluster: Instances, sim: Simulation, generations: dict[str, int],
                            groups: list[str], live: list[str], why: list[str]) -> Ownership | None:
    """The live instances own every partition, and each group is Stable at its owner with the same members in
    the same generation, its members following it there (FindCoordinator led them to the owner) and Stable.
    When not, `why` says what is missing (for the timeout's message)."""
    ownership = await cluster.ownership()
    if not ownership.complete(cluster.partitions, live):
        why[:] = [f"ownership not settled on {live}: {ownership}"]
        return None
    try:
        described = await described_at_owners(cluster, ownership, groups)
    except TRANSIENT as exc:
        why[:] = [f"DescribeGroups failed: {exc!r}"]
        return None
    members = members_by_group(sim)
    for group_id in groups:
        group = described[group_id]
        owner = cluster[ownership.owners[cluster.partition_of(group_id)]]
        if group.error_code != NONE or group.group_state != "Stable":
            why[:] = [f"{group_id} at {owner.instance_id}: error {group.error_code}, state {group.group_state}"]
            return None
        if {m.member_id for m in group.members} != {m.member_id for m in members[group_id]}:
            why[:] = [f"{group_id} at {owner.instance_id}: members {[m.member_id for m in group.members]}, "
                      f"simulated {[m.member_id for m in members[group_id]]}"]
            return None
        for member in members[group_id]:
            if member.phase != "stable" or member.generation != generations[group_id]:
                why[:] = [f"{member.key}: phase {member.phase}, generation {member.generation} "
                          f"(was {generations[group_id]})"]
                return None
            if member.coordinator != owner.address or member.client is None or member.client.is_closed:
                why[:] = [f"{member.key} talks to {member.coordinator}, the owner is {owner.instance_id} "
                          f"{owner.address}"]
                return None
    return ownership


async def until_carried_on(cluster: Instances, sim: Simulation, generations: dict[str, int], groups: list[str],
                           live: list[str], timeout_s: float, what: str) -> Ownership:
    why: list[str] = []
    try:
        return await wait_until(lambda: groups_carried_on(cluster, sim, generations, groups, live, why),
                                timeout_s, what, 0.25)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen: {why[0] if why else '-'}") from None


async def heartbeats_accepted(cluster: Instances, ownership: Ownership, sim: Simulation, groups: list[str]) -> None:
    """Every member's own identity (member id, generation) heartbeats successfully at its group's owner."""
    members = members_by_group(sim)
    for group_id in groups:
        client = await connect(cluster[ownership.owners[cluster.partition_of(group_id)]].address)
        try:
            for member in members[group_id]:
                response = await client.request(heartbeat(group_id, member.generation, member.member_id))
                assert response.error_code == NONE, (group_id, member.member_id, response.error_code)
        finally:
            await client.close()


class Committer:
    """Commits ever higher offsets for groups, with a live member's identity, at one instance, until the
    connection drops; remembers per group the last offset acknowledged and the last one sent."""

    def __init__(self, sim: Simulation, groups: list[str], instance: Instance) -> None:
        self.members = members_by_group(sim)
        self.groups = groups
        self.instance = instance
        self.acked: dict[str, int] = {}
        self.sent: dict[str, int] = {}
        self.rounds = 0

    async def run(self) -> None:
        client = await connect(self.instance.address)
        try:
            while True:
                self.rounds += 1
                for group_id in self.groups:
                    member = self.members[group_id][0]
                    self.sent[group_id] = self.rounds
                    codes = await commit(client, group_id, member.generation, member.member_id, {0: self.rounds},
                                         topic=ACKED_TOPIC)
                    assert codes == [NONE], (group_id, codes)
                    self.acked[group_id] = self.rounds
        except TRANSIENT:
            return  # the instance is gone: what was acknowledged so far is what must survive
        finally:
            await client.close()


def loaded_groups(instances: list[Instance], since: dict[str, int]) -> dict[str, list[str]]:
    """group id -> the instances that logged loading it after the given log offsets."""
    loaded: dict[str, list[str]] = collections.defaultdict(list)
    for instance in instances:
        for group_id in GROUP_LOADED.findall(instance.log_text(since[instance.instance_id])):
            loaded[group_id].append(instance.instance_id)
    return loaded


def generations_completed_twice(events: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Per group, generations that more than one rebalance completed: two coordinators serving one group."""
    seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for event in events:
        if event["type"] == "rebalance_completed":
            seen[event["group_id"]][event["generation"]] += 1
    return {g: sorted(n for n, count in counts.items() if count > 1) for g, counts in seen.items()
            if any(count > 1 for count in counts.values())}


# ---------------------------------------------------------------------------------------------------- (a) SIGKILL

async def test_sigkill_moves_an_instance_groups_and_their_members_carry_on(kafka_bootstrap: str) -> None:
    event_topic = unique("__events-failover")
    async with Instances(kafka_bootstrap, 3, event_topic=event_topic) as cluster:
        entry, victim = cluster["i1"], cluster["i2"]
        before = await cluster.until_settled()
        placed = spread_groups(cluster, before, GROUPS_PER_INSTANCE, unique("kill"))
        groups = [g for ids in placed.values() for g in ids]
        moved = placed[victim.instance_id]
        survivors = [i for i in cluster if i is not victim]
        sim = await start_members(cluster, entry, groups, MEMBER_SESSION_MS)
        try:
            generations = {m.group_id: m.generation for m in sim.members}
            await until_carried_on(cluster, sim, generations, groups, list(cluster.instances), 30,
                                   "the 60 groups served at their owners before the kill")

            committer = Committer(sim, moved, victim)
            committing = asyncio.create_task(committer.run())
            await wait_until(lambda: committer.rounds >= 3 or committing.done(), 60, "two rounds of commits acked")
            assert not committing.done(), committing.exception()
            since = {i.instance_id: i.log_offset() for i in survivors}
            killed_at_ms = time.time() * 1000
            killed_at = time.monotonic()
            reconnects_before = sim.stats.connection_errors
            await victim.kill()
            await asyncio.wait_for(committing, 30)

            live = [i.instance_id for i in survivors]
            after = await until_carried_on(cluster, sim, generations, groups, live, ONE_FAILOVER_S,
                                           "every group served again, its members following it")
            failover_s = time.monotonic() - killed_at
            print(f"failover: {len(moved)} groups moved and Stable {failover_s:.1f} s after SIGKILL")

            # every member of a moved group lost its connection and found its group's new owner (checked above)
            assert sim.stats.connection_errors - reconnects_before >= len(moved) * MEMBERS

            # the victim's partitions went to the survivors; the survivors kept theirs (cooperative-sticky)
            assert after.of(victim.instance_id) == set()
            for instance in survivors:
                assert before.of(instance.instance_id) <= after.of(instance.instance_id)
            await heartbeats_accepted(cluster, after, sim, groups)

            # no acknowledged offset lost: each moved group's offset is the last acked or a later one sent
            owners_of_moved = {g: cluster[after.owners[cluster.partition_of(g)]] for g in moved}
            for group_id, owner in owners_of_moved.items():
                client = await connect(owner.address)
                try:
                    offset = (await fetch_offsets(client, group_id, (0,), topic=ACKED_TOPIC))[0]
                finally:
                    await client.close()
                assert committer.acked[group_id] <= offset <= committer.sent[group_id], \
                    (group_id, committer.acked[group_id], offset, committer.sent[group_id])

            # each moved group loaded by its new owner alone (an instance that stalls re-reads its own groups:
            # more than one load by the owner is allowed, a load anywhere else is not)
            loaded = loaded_groups(survivors, since)
            assert set(moved) <= set(loaded), sorted(set(moved) - set(loaded))[:10]
            wrong = {g: ids for g, ids in loaded.items() if set(ids) != {after.owners[cluster.partition_of(g)]}}
            assert not wrong, f"groups loaded by an instance that does not own them: {dict(list(wrong.items())[:5])}"

            # the event topic: no generation completed twice; the moved groups did not rebalance at all
            events = await asyncio.to_thread(read_topic, kafka_bootstrap, event_topic)
            assert not generations_completed_twice(events)
            disturbed = {e["group_id"] for e in events if e["ts_ms"] >= killed_at_ms
                         and e["type"] in ("rebalance_started", "member_failed", "member_left")}
            assert not disturbed, f"groups rebalanced by the failover: {sorted(disturbed)[:10]}"
            assert not any(MEMBER_FAILED.search(i.log_text(since[i.instance_id])) for i in survivors)
        finally:
            await sim.close()


# ---------------------------------------------------------------------------------------------------- (b) zombie

async def test_a_frozen_instance_wakes_up_fenced_and_serves_nothing_it_lost(kafka_bootstrap: str) -> None:
    event_topic = unique("__events-zombie")
    member_session_ms = 10_000  # shorter than the freeze: the zombie's own timers find every member expired
    async with Instances(kafka_bootstrap, 3, event_topic=event_topic) as cluster:
        entry, zombie = cluster["i1"], cluster["i3"]
        before = await cluster.until_settled()
        placed = spread_groups(cluster, before, 10, unique("zombie"))
        groups = [g for ids in placed.values() for g in ids]
        moved = placed[zombie.instance_id]
        others = [i.instance_id for i in cluster if i is not zombie]
        sim = await start_members(cluster, entry, groups, member_session_ms)
        queued: list[asyncio.Future] = []
        client = await connect(zombie.address)  # a client's connection, open before the freeze
        try:
            generations = {m.group_id: m.generation for m in sim.members}
            identity = {g: (ms[0].generation, ms[0].member_id) for g, ms in members_by_group(sim).items()}
            paused_ms = time.time() * 1000
            paused_at = time.monotonic()
            zombie.pause()
            try:
                await until_carried_on(cluster, sim, generations, groups, others, ONE_FAILOVER_S + 15,
                                       "the frozen instance's groups served by the others")
                await wait_until(lambda: time.monotonic() - paused_at > member_session_ms / 1000 + 1, 60,
                                 "the freeze to outlast the members' sessions")
                # requests waiting in its socket: the first thing it reads when it wakes
                for group_id in moved:
                    generation, member_id = identity[group_id]
                    queued.append(asyncio.ensure_future(commit(client, group_id, generation, member_id,
                                                               {0: 424_242}, topic="zombie", timeout_ms=120_000)))
                    queued.append(asyncio.ensure_future(
                        client.request(heartbeat(group_id, generation, member_id), timeout_ms=120_000)))
                queued.append(asyncio.ensure_future(client.request(describe_request(moved), timeout_ms=120_000)))
                await asyncio.sleep(0)  # let the requests go out while it is still frozen
                woke_at = zombie.log_offset()
            finally:
                zombie.resume()
            answers = await asyncio.wait_for(asyncio.gather(*queued), 120)
            described = answers.pop()
            codes = [a[0] if isinstance(a, list) else int(a.error_code) for a in answers]
            codes += [int(g.error_code) for g in described.groups]
            assert set(codes) == {NOT_COORDINATOR}, collections.Counter(codes)

            # it comes back as a member of the instances group and Kafka gives it a share again
            async def regained() -> int | None:
                return zombie.log_offset() if (await cluster.ownership()).of(zombie.instance_id) else None

            regained_at = await wait_until(regained, ONE_FAILOVER_S + 30, "the woken instance assigned partitions")
            after = await until_carried_on(cluster, sim, generations, groups, list(cluster.instances),
                                           ONE_FAILOVER_S + 30, "the woken instance back, every group served")
            await heartbeats_accepted(cluster, after, sim, groups)

            # nothing it lost was expired, rebalanced or written by it: not before Kafka gave it partitions again,
            # and never for the groups it did not get back
            kept_away = {g for g in moved if after.owners[cluster.partition_of(g)] != zombie.instance_id}
            for since, until, which in ((woke_at, regained_at, set(moved)), (woke_at, None, kept_away)):
                text = zombie.log_text(since, until)
                expired = set(MEMBER_FAILED.findall(text)) & which
                assert not expired, f"the zombie expired members of groups it no longer owned: {sorted(expired)[:5]}"
                active = set(GROUP_ACTIVITY.findall(text)) & which
                assert not active, f"the zombie ran group logic for groups it lost: {sorted(active)[:5]}"
            for group_id in moved:
                owner = cluster[after.owners[cluster.partition_of(group_id)]]
                owner_client = await connect(owner.address)
                try:
                    offsets = await fetch_offsets(owner_client, group_id, (0,), topic="zombie")
                finally:
                    await owner_client.close()
                assert offsets == {0: -1}, f"a write the zombie answered NOT_COORDINATOR landed: {group_id} {offsets}"
            events = await asyncio.to_thread(read_topic, kafka_bootstrap, event_topic)
            assert not generations_completed_twice(events)
            failed = {e["group_id"] for e in events if e["type"] == "member_failed" and e["ts_ms"] >= paused_ms}
            assert not failed, f"members reported failed though they kept heartbeating: {sorted(failed)[:5]}"
        finally:
            for future in queued:
                future.cancel()
            await client.close()
            await sim.close()


# ---------------------------------------------------------------------------------------------------- (c) rolling

class Trickle:
    """A producer writing one record to every partition every `interval_s`, in a thread, until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, interval_s: float = 0.1) -> None:
        self.bootstrap, self.topic, self.partitions, self.interval_s = bootstrap, topic, partitions, interval_s
        self.sent: dict[int, int] = {p: 0 for p in range(partitions)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trickle", daemon=True)

    def start(self) -> Trickle:
        self._thread.start()
        return self

    def _run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 5, "log_level": 3})
        while not self._stop.is_set():
            for partition in range(self.partitions):
                n = self.sent[partition]
                producer.produce(self.topic, value=f"p{partition}-{n}".encode(), partition=partition)
                self.sent[partition] = n + 1
            producer.poll(0)
            self._stop.wait(self.interval_s)
        assert producer.flush(60) == 0, "trickle records not delivered"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)

    def values(self) -> set[str]:
        return {f"p{p}-{n}" for p, count in self.sent.items() for n in range(count)}


class Watch:
    """Samples, every quarter second, how many records of each partition the consumers have taken and the group's
    committed offsets (OffsetFetch at the owner FindCoordinator names): the longest stretch any partition went
    with no record consumed (records are produced to every partition all along), and every committed offset that
    went backwards."""

    def __init__(self, cluster: Instances, consumers: list[Any], group: str, topic: str, partitions: int) -> None:
        self.cluster, self.consumers, self.group, self.topic, self.partitions = \
            cluster, consumers, group, topic, partitions
        self.longest_stall_s = 0.0
        self.committed: dict[int, int] = {}
        self.backwards: list[tuple[int, int, int]] = []
        self.samples = 0
        self.counting = True  # set False when the producer stops: no records to consume is no stall
        self._counts: dict[int, int] = {}
        self._progress_at: dict[int, float] = {}

    def consumed(self) -> int:
        return sum(len(consumer.records) for consumer in self.consumers)

    def _note_progress(self) -> None:
        counts = collections.Counter(r[0] for consumer in self.consumers for r in consumer.records)
        now = time.monotonic()
        for partition in range(self.partitions):
            if counts[partition] > self._counts.get(partition, 0):
                self._counts[partition], self._progress_at[partition] = counts[partition], now
            elif partition in self._progress_at:  # consuming it has begun, nothing new since
                self.longest_stall_s = max(self.longest_stall_s, now - self._progress_at[partition])

    async def run(self) -> None:
        while True:
            if self.counting:
                self._note_progress()
            await self._sample_offsets()
            await asyncio.sleep(0.25)

    async def _sample_offsets(self) -> None:
        for instance in self.cluster.live():
            try:
                client = await connect(instance.address, timeout_ms=3_000)
            except TRANSIENT:
                continue
            try:
                code, owner = await find_coordinator(client, self.group)
                if code != NONE or owner is None:
                    return
                if owner != instance.address:
                    await client.close()
                    client = await connect(owner, timeout_ms=3_000)
                offsets = await committed_offsets(client, self.group, self.topic, range(self.partitions))
            except TRANSIENT:  # moving: no sample this time
                return
            finally:
                await client.close()
            if offsets is None:  # not served there (moving, loading): no sample this time
                return
            self.samples += 1
            for partition, offset in offsets.items():
                previous = self.committed.get(partition, -1)
                if offset < previous:
                    self.backwards.append((partition, previous, offset))
                self.committed[partition] = max(previous, offset)
            return


async def test_rolling_restart_of_every_instance_under_stock_consumers_through_the_relay(
        kafka_bootstrap: str) -> None:
    from tests.support.relay import create_topic, settled_assignment, start_consumers, stop_all

    topic, group, partitions = unique("rolling"), unique("rolling-group"), 6
    consumer_session_ms = 10_000
    one_failover_s = (INSTANCE_SESSION_MS + consumer_session_ms) / 1000 + 20
    await asyncio.to_thread(create_topic, kafka_bootstrap, topic, partitions)
    async with Instances(kafka_bootstrap, 3, relay=True) as cluster:
        consumers: list[Any] = []
        trickle = Trickle(kafka_bootstrap, topic, partitions).start()
        watching: asyncio.Task | None = None
        try:
            consumers = await start_consumers([("confluent", "rdk-rolling"), ("aiokafka", "aio-rolling")],
                                              cluster.bootstrap, topic, group, "range",
                                              session_ms=consumer_session_ms)
            await wait_until(lambda: settled_assignment(consumers, partitions), FORM_TIMEOUT_S,
                             "both consumers assigned")
            watch = Watch(cluster, consumers, group, topic, partitions)
            watching = asyncio.create_task(watch.run())
            await wait_until(lambda: watch.consumed() > 100, 60, "records consumed through the relay")
            for instance in cluster:
                assert await instance.terminate() == 0, instance.log_tail()
                await cluster.restart(instance.instance_id)
                await cluster.until_settled(list(cluster.instances))
                mark, samples_mark = watch.consumed(), watch.samples
                await wait_until(lambda: watch.consumed() > mark + 60, one_failover_s,
                                 f"consumption going on after {instance.instance_id}'s restart")
                # the backwards check must have seen committed offsets after each restart, not just before them
                await wait_until(lambda: watch.samples >= samples_mark + 3, 60,
                                 f"committed offsets sampled after {instance.instance_id}'s restart")
            watch.counting = False
            await asyncio.to_thread(trickle.stop)
            expected = trickle.values()
            await wait_until(lambda: expected <= {v for c in consumers for _p, _o, v, _c in c.records}, 120,
                             "every record produced consumed")
            await wait_until(lambda: watch.committed == {p: n for p, n in trickle.sent.items()}, 60,
                             "every record's offset committed")
            print(f"rolling restart: longest stall {watch.longest_stall_s:.1f} s, {watch.samples} offset samples")
            assert watch.longest_stall_s <= one_failover_s, watch.longest_stall_s
            assert watch.samples >= 3 * len(cluster.instances)
            assert not watch.backwards, f"committed offsets went backwards: {watch.backwards[:5]}"
        finally:
            if watching is not None:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
            await asyncio.to_thread(trickle.stop)
            await stop_all(consumers)
