"""Several `coordinator serve --instance-id` processes on one state topic, a real broker deciding who owns which
partition (coordinator/cluster): every partition served by exactly one instance, the others answering
NOT_COORDINATOR, FindCoordinator on any of them naming the owner; a third instance takes a share while the others keep serving theirs; a clean stop moves its
partitions at once with their groups and offsets; a paused instance serves nothing until Kafka confirms it
still owns its partitions. Black-box: requests on the wire and the instances' logs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

from coordinator.group.partitioner import partition_for
from coordinator.loadgen.formation import form_stable_group
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from tests.support import service as e2e
from tests.support.wire import request

PARTITIONS = 6
# the instances' session in the broker's group: long enough that a move seen within it proves a LeaveGroup (a
# broker rebalance on a loaded 2-core machine takes seconds), and a pause of a third of it is not an expiry
SESSION_MS = 30_000
NONE, LOAD_IN_PROGRESS, NOT_COORDINATOR = 0, 14, 16
PROBES = {p: next(f"probe-{p}-{i}" for i in range(10_000) if partition_for(f"probe-{p}-{i}", PARTITIONS) == p)
          for p in range(PARTITIONS)}  # one group id per state partition


class Instance:
    def __init__(self, instance_id: str, service: e2e.Service, client: KafkaClient) -> None:
        self.instance_id = instance_id
        self.service = service
        self.client = client

    async def answer(self, partition: int) -> int:
        """The error code of DescribeGroups for a group of `partition`: NONE when this instance serves it."""
        return (await e2e.describe(self.client, PROBES[partition])).error_code


@contextlib.asynccontextmanager
async def instance(bootstrap: str, state_topic: str, instance_id: str) -> AsyncIterator[Instance]:
    async with e2e.service(bootstrap, state_topic, f"offsets.topic.num.partitions={PARTITIONS}",
                           "group.initial.rebalance.delay.ms=0",
                           args=("--instance-id", instance_id,
                                 "--instance-session-timeout-ms", str(SESSION_MS))) as service:
        client = await service.client()
        try:
            yield Instance(instance_id, service, client)
        finally:
            await client.close()


async def owners(instances: list[Instance]) -> dict[int, list[str]]:
    """partition → the instances serving it; asserts every other answer is NOT_COORDINATOR or LOAD_IN_PROGRESS
    (never a wrong answer from a non-owner)."""
    serving: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        for inst in instances:
            code = await inst.answer(p)
            assert code in (NONE, NOT_COORDINATOR, LOAD_IN_PROGRESS), (inst.instance_id, p, code)
            if code == NONE:
                serving[p].append(inst.instance_id)
    return serving


async def until_settled(instances: list[Instance], timeout_s: float = 90,
                        between: Any = None) -> dict[int, str]:
    """partition → its one owner, once every partition has exactly one and every instance owns some (never two
    owners at once meanwhile); `between()` is awaited between rounds."""
    deadline = time.monotonic() + timeout_s
    while True:
        serving = await owners(instances)
        assert all(len(ids) <= 1 for ids in serving.values()), f"a partition served twice: {serving}"
        owned = {p: ids[0] for p, ids in serving.items() if ids}
        if len(owned) == PARTITIONS and set(owned.values()) == {i.instance_id for i in instances}:
            return owned
        assert time.monotonic() < deadline, f"not settled: {serving}"
        await (between() if between is not None else asyncio.sleep(0.05))


async def test_instances_share_the_partitions_a_third_takes_a_share_a_clean_stop_moves_them(
        kafka_bootstrap: str) -> None:
    state_topic = e2e.unique("instances-state")
    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(instance(kafka_bootstrap, state_topic, "a"))
        b = await stack.enter_async_context(instance(kafka_bootstrap, state_topic, "b"))
        first = await until_settled([a, b])  # both took a share, each partition served by exactly one

        # a group and its offsets on the instance owning it
        by_id = {"a": a, "b": b}
        group = PROBES[next(p for p, owner in first.items() if owner == "a")]
        members = await form_stable_group("127.0.0.1", a.service.port, group, size=2, session_ms=60_000)
        stack.push_async_callback(_close_members, members)
        leader = next(m for m in members if m.is_leader)
        assert await e2e.commit(a.client, group, leader.generation_id, leader.member_id, {0: 11, 1: 22}) == [0, 0]
        before = await e2e.describe(a.client, group)
        assert before.group_state == "Stable" and len(before.members) == 2

        # a third instance joins: it takes a share, cooperatively (what a and b keep is served throughout)
        c_started = asyncio.ensure_future(stack.enter_async_context(instance(kafka_bootstrap, state_topic, "c")))
        interruptions: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        while not c_started.done():
            await _probe_owners(first, by_id, interruptions)
        c = by_id["c"] = c_started.result()
        second = await until_settled([a, b, c], between=lambda: _probe_owners(first, by_id, interruptions))
        kept = [p for p in range(PARTITIONS) if second[p] == first[p]]
        assert kept, (first, second)
        # (an owner whose loop stalled past the zombie guard's threshold on this busy machine stops serving until
        # Kafka confirms: that is the guard, not the rebalance)
        stalled = {i for i in ("a", "b") if "event=instance_stalled" in by_id[i].service.log_text()}
        assert all(interruptions[p] == [] for p in kept if first[p] not in stalled), (first, second, interruptions)
        await until_every_instance_names_the_owners([a, b, c], second)  # FindCoordinator on any instance

        # a clean stop of the instance owning the group: its partitions move at once, the group with them
        owner_id = second[partition_for(group, PARTITIONS)]
        leaving = by_id.pop(owner_id)
        moved = [p for p, o in second.items() if o == owner_id]
        stopped_at = time.monotonic()
        assert await leaving.service.terminate() == 0
        remaining = list(by_id.values())
        third = await until_settled(remaining, timeout_s=60)
        moved_s = time.monotonic() - stopped_at
        print(f"instance {owner_id} stopped cleanly: its partitions {moved} served elsewhere after {moved_s:.2f} s")
        assert moved_s < SESSION_MS / 1000, moved_s  # it left the group: no session timeout waited for
        assert all(third[p] == second[p] for p in range(PARTITIONS) if p not in moved)
        new_owner = by_id[third[partition_for(group, PARTITIONS)]]
        after = await e2e.describe(new_owner.client, group)
        assert (after.group_state, sorted(m.member_id for m in after.members)) == (
            "Stable", sorted(m.member_id for m in before.members))
        assert await e2e.fetch_offsets(new_owner.client, group, (0, 1)) == {0: 11, 1: 22}
        assert "event=membership_left" in leaving.service.log_text()


async def until_every_instance_names_the_owners(instances: list[Instance], owner_of: dict[int, str],
                                              timeout_s: float = 30) -> None:
    """FindCoordinator for a group of each partition, asked of every instance, answers the owning instance's
    node and address (the owner maps refresh every second: bounded wait)."""
    ports = {i.instance_id: i.service.port for i in instances}
    deadline = time.monotonic() + timeout_s
    while True:
        answers = {(inst.instance_id, p): await find_coordinator(inst.client, PROBES[p])
                   for inst in instances for p in range(PARTITIONS)}
        wrong = {key: answer for key, answer in answers.items() if answer != (NONE, ports[owner_of[key[1]]])}
        if not wrong:
            return
        assert time.monotonic() < deadline, f"FindCoordinator answers not the owner: {wrong}"
        await asyncio.sleep(0.2)


async def find_coordinator(client: KafkaClient, group_id: str) -> tuple[int, int]:
    response = await client.request(request(ApiKey.FIND_COORDINATOR, 3, key=group_id, key_type=0))
    return int(response.error_code), int(response.port)


async def _probe_owners(owner_by_partition: dict[int, str], by_id: dict[str, Instance],
                        interruptions: dict[int, list[int]]) -> None:
    """One round of requests to each partition's owner; records any answer that is not NONE."""
    for p, owner_id in owner_by_partition.items():
        code = await by_id[owner_id].answer(p)
        if code != NONE:
            interruptions[p].append(code)
    await asyncio.sleep(0.02)


async def _close_members(members: list[Any]) -> None:
    for member in members:
        await member.client.close()


async def test_paused_instance_serves_nothing_until_kafka_confirms_its_partitions(kafka_bootstrap: str) -> None:
    """SIGSTOP for longer than the stall threshold (a third of the session) but shorter than the session: Kafka
    keeps the partitions with it, and the first request read after SIGCONT is answered NOT_COORDINATOR all the
    same (the instance cannot know yet); once DescribeGroups of the instances group confirms, it serves again."""
    state_topic = e2e.unique("instances-zombie")
    async with instance(kafka_bootstrap, state_topic, "solo") as solo:
        await until_settled([solo])
        pid = solo.service.process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(SESSION_MS / 3 / 1000 + 1.0)
            asked = asyncio.ensure_future(solo.answer(0))  # read by the instance only when it runs again
            await asyncio.sleep(0.2)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert await asyncio.wait_for(asked, 30) == NOT_COORDINATOR
        await until_settled([solo], timeout_s=30)  # confirmed: served again
        log_text = solo.service.log_text()
        assert "event=instance_stalled" in log_text and "event=ownership_confirmed" in log_text, log_text[-3000:]


async def test_a_fence_from_elsewhere_is_undone_while_kafka_still_assigns_the_partition_to_us(
        kafka_bootstrap: str) -> None:
    """Something else initialises a partition's transactional.id while Kafka still assigns the partition to our
    instance (a previous owner's producer re-initialised after an outage, before it heard its membership was
    lost): our next write there is fenced. The instance stops serving the partition at once, asks Kafka, finds it
    still assigned, fences the intruder in turn, reads the partition again and serves it: clients rejoin and form
    their group. (It used to give the partition up: served by nobody until the next rebalance.)"""
    from confluent_kafka import KafkaException, Producer

    state_topic = e2e.unique("instances-fenced")
    partition = 2
    async with instance(kafka_bootstrap, state_topic, "solo") as solo:
        await until_settled([solo])
        intruder = Producer({"bootstrap.servers": kafka_bootstrap,
                             "transactional.id": f"group-coordinator-{state_topic}-p{partition}"})
        await asyncio.to_thread(intruder.init_transactions, 60)
        group = next(g for g in (f"fenced-{i}" for i in range(10_000)) if partition_for(g, PARTITIONS) == partition)
        members = await form_stable_group("127.0.0.1", solo.service.port, group, size=2, session_ms=60_000,
                                          timeout_s=120)
        try:
            log_text = solo.service.log_text()
            assert f"event=partition_fenced partition={partition}" in log_text, log_text[-3000:]
            assert f"event=fence_confirmed taken_back=[{partition}]" in log_text, log_text[-3000:]
            await until_settled([solo], timeout_s=30)
        finally:
            await _close_members(members)
        intruder.begin_transaction()
        intruder.produce(state_topic, b"never visible", partition=partition)
        try:
            await asyncio.to_thread(intruder.commit_transaction, 30)
            raise AssertionError("the intruder's transaction committed: it was not fenced in turn")
        except KafkaException as refused:
            assert refused.args[0].fatal(), refused
        finally:
            await asyncio.to_thread(intruder.purge)
            del intruder  # destroyed here: close() would try to abort the fenced transaction
