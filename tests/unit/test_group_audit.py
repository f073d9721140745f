"""Findings of the audit against Kafka 3.9's GroupCoordinator.scala (one test per finding), and odd inputs
that must never escape a handler or wedge a group. Manual clock throughout."""
from __future__ import annotations

import asyncio

from coordinator.group.errors import Errors
from coordinator.group.state import GroupState
from tests.unit.test_group_harness import (REBALANCE_MS, Env, advance_until_joined, drain, env,  # noqa: F401
                                           form_group, subscription)

STABLE, PREPARING, COMPLETING, EMPTY = (GroupState.STABLE, GroupState.PREPARING_REBALANCE,
                                        GroupState.COMPLETING_REBALANCE, GroupState.EMPTY)


async def test_pending_member_expiration_is_completed_when_the_member_joins(env: Env) -> None:
    # Kafka: the join's completeAndScheduleNextExpiration checks the member key, which completes the
    # KIP-394 pending-member DelayedHeartbeat (tryCompleteHeartbeat: a pending id that is now a member).
    a = env.client("a")
    await a.start_join()
    assert a.member_id in env.group().members
    assert env.coordinator.heartbeat_purgatory.delayed == 1  # only the new-member join timeout
    assert env.timer.size == 2  # that and the InitialDelayedJoin


async def test_duplicate_protocol_names_do_not_wedge_the_group(env: Env) -> None:
    # A member listing one protocol twice still supports it once: the vote must find it, the join phase
    # must complete (Kafka counts it twice and its selectProtocol throws, leaving the group stuck).
    meta = subscription("t")
    a = env.client("a", protocols=[("range", meta), ("range", meta)])
    b = env.client("b", protocols=[("range", meta), ("roundrobin", meta)])
    await a.start_join()
    await b.start_join()
    await advance_until_joined(env, a, b)
    ra, rb = a.take_join(), b.take_join()
    assert ra.error_code == rb.error_code == Errors.NONE
    assert ra.protocol_name == rb.protocol_name == "range" and env.state() is COMPLETING
