"""The heartbeats of a consumer group that find its target to compute within one loop turn share one computation:
their records replayed at once (epochs bumped as each one arrives), the target computed once for the group epoch
they reach, each member reconciled towards it and answered once the batch's write is acknowledged. Through the
runtime on a manual clock and the in-memory store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from coordinator.group.assignor import ASSIGNORS, GroupSpec
from coordinator.group.errors import kafka4_append_error
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.records import (CurrentAssignmentRecord, GroupEpochRecord, MemberMetadataRecord,
                                              TargetAssignmentEpochRecord, TargetAssignmentRecord)
from protocol.error_codes import Errors
from tests.support.consumer_group_env import FOO, GROUP, Env


@pytest.fixture
async def env():  # type: ignore[no-untyped-def]
    environment = Env()
    yield environment
    await environment.close()


class CountedAssignor:
    """The uniform assignor, each run's member count kept: put in ASSIGNORS in its place (a compiled assignor's
    methods cannot be replaced on the instance)."""

    def __init__(self, inner: Any, runs: list[int]) -> None:
        self.name, self._inner, self._runs = inner.name, inner, runs

    def assign(self, spec: GroupSpec) -> Any:
        self._runs.append(len(spec.members))
        return self._inner.assign(spec)


@pytest.fixture
def assignor_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The number of members of every run of the uniform assignor."""
    runs: list[int] = []
    monkeypatch.setitem(ASSIGNORS, "uniform", CountedAssignor(ASSIGNORS["uniform"], runs))
    yield runs


def replayed(records: list) -> ConsumerGroup:  # type: ignore[type-arg]
    """The group as a load rebuilds it from what was written."""
    group = ConsumerGroup(GROUP)
    for record in records:
        group.replay(record)
    return group


def assert_log_matches_memory(env: Env) -> None:
    loaded, memory = replayed(env.store.consumer_records), env.group()
    assert (loaded.group_epoch, loaded.assignment_epoch, loaded.metadata_hash) == (
        memory.group_epoch, memory.assignment_epoch, memory.metadata_hash)
    assert loaded.targets == memory.targets
    assert loaded.members == memory.members


async def test_joins_of_one_turn_share_one_target_and_are_answered_at_its_epoch(env: Env,
                                                                                assignor_runs: list[int]) -> None:
    answers = await asyncio.gather(*(env.heartbeat(f"m{i}", 0) for i in range(3)))
    assert assignor_runs == [3]
    assert [(a.error, a.member_id, a.member_epoch) for a in answers] == [
        (Errors.NONE, "m0", 3), (Errors.NONE, "m1", 3), (Errors.NONE, "m2", 3)]
    # every member's share at once (nobody owned anything), together every partition once
    shares = [a.assignment[FOO] for a in answers]  # type: ignore[index]
    assert sorted(p for share in shares for p in share) == list(range(6)) and all(len(s) == 2 for s in shares)
    # each join's own records and epoch bump as it arrived, then one target (7 per member, then 6), then each
    # member's reconciliation, in arrival order: one write
    kinds = [type(r) for r in env.records]
    assert kinds == [MemberMetadataRecord, GroupEpochRecord] * 3 + [TargetAssignmentRecord] * 3 + [
        TargetAssignmentEpochRecord] + [CurrentAssignmentRecord] * 3
    assert [r.epoch for r in env.records if isinstance(r, GroupEpochRecord)] == [1, 2, 3]
    assert [r.member_id for r in env.records if isinstance(r, CurrentAssignmentRecord)] == ["m0", "m1", "m2"]
    assert env.group().state.value == "Stable"
    assert_log_matches_memory(env)


async def test_a_heartbeat_alone_in_its_turn_is_answered_as_without_batching(env: Env,
                                                                             assignor_runs: list[int]) -> None:
    first = await env.heartbeat("a", 0)
    second = await env.heartbeat("b", 0)
    assert assignor_runs == [1, 2]
    assert (first.member_epoch, first.assignment, second.member_epoch, second.assignment) == (
        1, {FOO: (0, 1, 2, 3, 4, 5)}, 2, {})  # b waits for a to release its partitions, as in Kafka


async def test_a_member_heartbeating_into_an_assigning_group_shares_the_joins_target(
        env: Env, assignor_runs: list[int]) -> None:
    await env.heartbeat("a", 0)
    a_then_joins = await asyncio.gather(env.heartbeat("a", 1, owned={FOO: tuple(range(6))}),
                                        *(env.heartbeat(f"m{i}", 0) for i in range(2)))
    # a's heartbeat came before the joins made the group Assigning: it changes nothing
    assert a_then_joins[0].member_epoch == 1
    assert assignor_runs == [1, 3]
    joins_then_a = await asyncio.gather(*(env.heartbeat(f"n{i}", 0) for i in range(2)),
                                        env.heartbeat("a", 1, owned={FOO: tuple(range(6))}))
    assert assignor_runs == [1, 3, 5]
    a = joins_then_a[2]
    # a still owns partitions the new target gives others: it is told to keep only its target (epoch stays)
    assert (a.error, a.member_epoch) == (Errors.NONE, 1)
    assert set(a.assignment[FOO]) == set(env.group().target_of("a")[FOO])  # type: ignore[index]
    assert env.group().assignment_epoch == env.group().group_epoch == 5
    assert_log_matches_memory(env)


async def test_a_leave_in_the_same_turn_is_written_after_the_batch_it_follows(env: Env,
                                                                              assignor_runs: list[int]) -> None:
    await env.heartbeat("a", 0)
    answers = await asyncio.gather(*(env.heartbeat(f"m{i}", 0) for i in range(2)), env.heartbeat("a", -1))
    assert [x.error for x in answers] == [Errors.NONE] * 3
    # the batch was settled before the leave: its target included a; the leave bumped the epoch after it
    assert assignor_runs == [1, 3]
    group = env.group()
    assert "a" not in group.members and group.group_epoch == 4 and group.assignment_epoch == 3
    assert_log_matches_memory(env)
    later = await env.heartbeat("m0", answers[0].member_epoch, owned={})
    assert later.member_epoch == 4 and env.group().assignment_epoch == 4
    assert_log_matches_memory(env)


async def test_a_failed_batch_write_answers_every_member_and_reverts_the_group(env: Env) -> None:
    await env.heartbeat("a", 0)
    env.store.fail_next_write(Errors.NOT_ENOUGH_REPLICAS)
    answers = await asyncio.gather(*(env.heartbeat(f"m{i}", 0) for i in range(3)))
    # Kafka 4's answer to a heartbeat whose append was refused (as without batching)
    assert {a.error for a in answers} == {kafka4_append_error(Errors.NOT_ENOUGH_REPLICAS)}
    group = env.group()  # as the batch found it (the snapshot taken before its first join)
    assert set(group.members) == {"a"} and (group.group_epoch, group.assignment_epoch) == (1, 1)
    retried = await asyncio.gather(*(env.heartbeat(f"m{i}", 0) for i in range(3)))
    assert [r.member_epoch for r in retried] == [4, 4, 4]
    assert_log_matches_memory(env)


async def test_a_session_expiry_before_the_batch_settles_writes_after_it(env: Env) -> None:
    await env.heartbeat("a", 0)
    env.advance(40_000)
    pending = [asyncio.ensure_future(env.heartbeat(f"m{i}", 0)) for i in range(2)]
    await asyncio.sleep(0)  # the joins are read and replayed; their batch is not settled yet
    assert env.group().group_epoch == 3 and env.group().assignment_epoch == 1
    env.advance(5_000)  # a's session runs out in that same turn: its fence follows the batch
    answers = await asyncio.gather(*pending)
    assert [a.error for a in answers] == [Errors.NONE, Errors.NONE]
    for _ in range(3):
        await asyncio.sleep(0)
    assert "a" not in env.group().members and env.group().group_epoch == 4
    assert_log_matches_memory(env)


async def test_a_describe_in_the_joins_turn_sees_them_reconciled(env: Env) -> None:
    joins = [asyncio.ensure_future(env.heartbeat(f"m{i}", 0)) for i in range(2)]
    await asyncio.sleep(0)  # the joins are read; their batch is not settled yet
    [described] = env.runtime.consumer_groups.describe([GROUP])
    assert (described.state, described.group_epoch, described.assignment_epoch) == ("Stable", 2, 2)
    assert sorted(m.member_epoch for m in described.members) == [2, 2]
    assert [a.member_epoch for a in await asyncio.gather(*joins)] == [2, 2]
