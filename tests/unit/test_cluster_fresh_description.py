"""One describe path per instance: the zombie guard's confirmation asks the owner map (its thread, its one
AdminClient) for a description sent after the stall, never the cached map nor the answer to a request that was
already under way when the process stopped. DescribeGroups is scripted here (what Kafka would answer, and when);
against a real broker: tests/integration/test_instances_ownership.py."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from coordinator.cluster.identity import InstanceEndpoint, client_id_for
from coordinator.cluster.owner_map import Described, DescribedMember, OwnerMap
from coordinator.cluster.ownership import GroupAssignmentReader
from protocol.error_codes import Errors
from tests.support.group_harness import Env
from tests.support.ownership import STALL_MS, formed_then_owned, heartbeat
from tests.support.polling import wait_until

A = InstanceEndpoint("a", 2_000_000_101, "127.0.0.1", 9101)
B = InstanceEndpoint("b", 2_000_000_102, "127.0.0.1", 9102)
WAIT_S = 30.0  # bounded waits for the owner map's thread on a loaded machine


class ScriptedKafka:
    """DescribeGroups as the owner map's thread sees it: each call is numbered; the first blocks until released
    (a request under way while the process is stopped) and answers `before`; every later one answers `after`."""

    def __init__(self, before: Described, after: Described) -> None:
        self.before, self.after = before, after
        self.calls = 0
        self.first_in_flight = threading.Event()
        self.release_first = threading.Event()

    def describe(self) -> Described:
        self.calls += 1
        if self.calls == 1:
            self.first_in_flight.set()
            assert self.release_first.wait(WAIT_S)
            return self.before
        return self.after


def owner_map_on(kafka: ScriptedKafka, num_partitions: int) -> OwnerMap:
    owner_map = OwnerMap("127.0.0.1:1", "state.coordinators", "state", num_partitions, A, refresh_ms=60_000)
    owner_map._open_admin = lambda: None  # type: ignore[method-assign]  # no client: the describe is scripted
    owner_map._describe = kafka.describe  # type: ignore[method-assign]
    return owner_map


def group_of(*members: tuple[str, InstanceEndpoint, tuple[int, ...]]) -> Described:
    return Described(tuple(DescribedMember(member_id, client_id_for(endpoint), partitions)
                           for member_id, endpoint, partitions in members), stable=True)


async def test_a_fresh_description_is_never_the_answer_to_a_request_sent_before_it_was_asked() -> None:
    kafka = ScriptedKafka(before=group_of(("a-m", A, (0, 1)), ("b-m", B, (2,))),
                          after=group_of(("a-m", A, (0,)), ("b-m", B, (1, 2))))
    owner_map = owner_map_on(kafka, 3)
    await owner_map.start()
    try:
        assert await asyncio.to_thread(kafka.first_in_flight.wait, WAIT_S)
        fresh = asyncio.ensure_future(owner_map.describe_fresh())
        await asyncio.sleep(0.05)
        assert not fresh.done() and kafka.calls == 1
        kafka.release_first.set()  # the old request's answer arrives: it feeds the map, not the caller
        assert await asyncio.wait_for(fresh, WAIT_S) is kafka.after
        assert kafka.calls == 2  # one more DescribeGroups, sent after the call (and without the refresh pause)
        assert owner_map.owner(1) == B and owner_map.owner(2) == B  # and the map learnt it too
    finally:
        kafka.release_first.set()
        await owner_map.close()
    with pytest.raises(RuntimeError, match="not running"):
        await owner_map.describe_fresh()


async def test_a_failed_description_fails_its_callers() -> None:
    class Unreachable(ScriptedKafka):
        def describe(self) -> Described:
            raise RuntimeError("KafkaError{code=_TIMED_OUT}")

    owner_map = owner_map_on(Unreachable(group_of(), group_of()), 3)
    await owner_map.start()
    try:
        with pytest.raises(RuntimeError, match="_TIMED_OUT"):
            await asyncio.wait_for(owner_map.describe_fresh(), WAIT_S)
    finally:
        await owner_map.close()


async def test_the_guard_confirms_with_a_description_taken_after_the_stall() -> None:
    """Before the stop, the owner map had asked Kafka (the request is under way: its answer still shows the
    partition ours). While we were stopped, Kafka gave it to B. The confirmation must not take the old answer:
    the partition is given up, never served again by us."""
    env = Env()
    try:
        ownership, membership, _, partition = await formed_then_owned(env)
        kafka = ScriptedKafka(before=group_of((membership.member_id, A, (partition,)), ("b-m", B, ())),
                              after=group_of((membership.member_id, A, ()), ("b-m", B, (partition,))))
        owner_map = owner_map_on(kafka, env.coordinator.num_partitions)
        ownership._read_assignment = GroupAssignmentReader(owner_map.describe_fresh)  # as app.py wires it
        await owner_map.start()
        try:
            assert await asyncio.to_thread(kafka.first_in_flight.wait, WAIT_S)  # sent before the stop
            env.clock.advance(STALL_MS)  # the process did not run for a third of the session
            assert heartbeat(ownership, env) == Errors.NOT_COORDINATOR  # the first request after it finds the stall
            await asyncio.sleep(0.05)
            assert ownership.guard.suspended and kafka.calls == 1  # the confirmation waits for a new request
            kafka.release_first.set()  # the old answer ("still yours") arrives now
            await wait_until(lambda: not ownership.guard.suspended, WAIT_S, "not ownership.guard.suspended", 0.01)
            assert kafka.calls >= 2
            assert ownership.owned == set() and partition in env.store.unloaded
            assert heartbeat(ownership, env) == Errors.NOT_COORDINATOR
        finally:
            kafka.release_first.set()
            await ownership.close()
            await owner_map.close()
    finally:
        await env.close()


async def test_a_confirmation_kafka_does_not_answer_is_retried_and_said_once(
        caplog: pytest.LogCaptureFixture) -> None:
    env = Env()
    try:
        ownership, _, _, partition = await formed_then_owned(env)
        calls = 0

        async def unreachable(membership: object) -> set[int] | None:
            nonlocal calls
            calls += 1
            if calls <= 3:
                raise RuntimeError("KafkaError{code=_TRANSPORT}")
            return {partition}

        ownership._read_assignment = unreachable  # type: ignore[assignment]
        with caplog.at_level(logging.DEBUG, logger="coordinator.cluster"):
            env.clock.advance(STALL_MS)
            assert heartbeat(ownership, env) == Errors.NOT_COORDINATOR
            await wait_until(lambda: ownership.serving(partition), WAIT_S, "ownership.serving(partition)", 0.01)
        failed = [r for r in caplog.records if "event=ownership_confirm_failed" in r.message]
        assert [r.levelname for r in failed] == ["WARNING", "DEBUG", "DEBUG"], [r.message for r in failed]
        assert calls == 4
        await ownership.close()
    finally:
        await env.close()
