"""A TxnOffsetCommit the group refuses is verified with the transaction coordinator outside its producer's batch
lock: a verification the transaction coordinator leaves unanswered (the relay's 30 s timeouts) does not hold up
the producer's accepted requests (Kafka does not serialise a producer's TxnOffsetCommits). On the deterministic
simulator (virtual time), through the production handler and the simulated relay's verification faults."""
from __future__ import annotations

import asyncio
import random
from typing import Any

from coordinator.config import CoordinatorConfig
from coordinator.group.modern.heartbeat import HeartbeatRequest
from coordinator.group.modern.member import LEAVE_GROUP_MEMBER_EPOCH
from protocol.error_codes import Errors
from simulator.client_txns import UPSTREAM_TIMEOUT_MS, TransactionalApp, VerificationFaults, txn_offset_commit_request
from simulator.instance import CoordinatorInstance
from simulator.kafka import KafkaFaults
from simulator.run import Scenario, Simulation, TxnAppSpec, TxnProbeSpec, run_story

_NEVER_MS = 3_600_000


def _error(answer: Any) -> Errors | None:
    """The answer's error; None: no answer within the client's request timeout."""
    return None if answer is None else Errors(int(answer.topics[0].partitions[0].error_code))


def _simulation(app_spec: TxnAppSpec, verification: VerificationFaults | None = None) -> Simulation:
    # no probe of the scenario's own runs (the story sends); its faults are the verification's
    probe = None if verification is None else TxnProbeSpec((_NEVER_MS, _NEVER_MS), verification)
    return Simulation(Scenario(0, 0, CoordinatorConfig(offsets_topic_num_partitions=1), KafkaFaults(), [], [],
                               None, txn_apps=[app_spec], txn_probe=probe))


async def _loaded(sim: Simulation, app_spec: TxnAppSpec) -> tuple[CoordinatorInstance, TransactionalApp]:
    """A coordinator instance once it has loaded its partitions, and the application (not yet initialised)."""
    instance = sim._start_instance()
    while not instance.loaded:
        await asyncio.sleep(0.1)
    return instance, TransactionalApp(sim, 0, 1, app_spec.topics, app_spec.tv2, app_spec.version,
                                      app_spec.timeout_ms, random.Random(0))


def test_a_refused_request_whose_verification_stalls_does_not_delay_its_producers_accepted_one() -> None:
    # every verification's first attempt goes unanswered
    silent = VerificationFaults(find_error=0.0, describe_error=0.0, timeout=1.0, prepare_hold_ms=(0, 0))
    app_spec = TxnAppSpec({"t": 1}, True, 5, 60_000)
    sim = _simulation(app_spec, silent)
    seen: dict[str, Any] = {}

    async def story() -> None:
        instance, app = await _loaded(sim, app_spec)
        await app._init()
        # the same producer with a generation its group never had: refused, so the handler verifies first
        stale = txn_offset_commit_request(5, app.transactional_id, app.group_id, app.producer_id, app.epoch,
                                          {("t", 0): 3}, generation_id=4, member_id="gone")
        # served without a client's request timeout (30 s, as long as the relay's): the handler's own answer
        refused = instance.serve("txn_offset_commit", stale, "zombie", "")
        await asyncio.sleep(1)  # virtual: the refused request is waiting for the transaction coordinator
        seen["refused_pending_before"] = not refused.done()
        sent_ms = sim.now_ms()
        accepted = await app._call("txn_offset_commit", txn_offset_commit_request(
            5, app.transactional_id, app.group_id, app.producer_id, app.epoch, {("t", 0): 7}))
        seen["accepted"] = _error(accepted)
        seen["accepted_within_1s"] = sim.now_ms() - sent_ms < 1_000
        seen["refused_pending_after"] = not refused.done()
        answer = await asyncio.wait_for(refused, 4 * UPSTREAM_TIMEOUT_MS / 1000)
        seen["refused_after_the_timeout"] = sim.now_ms() - sent_ms >= UPSTREAM_TIMEOUT_MS - 1_000
        seen["refused"] = _error(answer)
        assert sim.relay is not None
        seen["verified"] = [outcome for _, outcome in sim.relay.verifications]

    run_story(sim, story())
    unverified = Errors.REQUEST_TIMED_OUT in seen.pop("verified")  # the relay's second attempt unanswered too
    # answered, the group is checked as it is then: the accepted commit made it (Empty), without that member
    assert seen == {"refused_pending_before": True, "accepted": Errors.NONE, "accepted_within_1s": True,
                    "refused_pending_after": True, "refused_after_the_timeout": True,
                    "refused": Errors.COORDINATOR_NOT_AVAILABLE if unverified else Errors.UNKNOWN_MEMBER_ID}, seen
    assert sim.checkers.violations == []


def test_a_request_the_group_refuses_only_once_it_has_the_lock_is_verified_first() -> None:
    """The group accepted the request, which then waited behind its producer's batch in flight; meanwhile its
    member left. As Kafka, the transaction coordinator's error answers before the group's (an older epoch:
    INVALID_PRODUCER_EPOCH, not UNKNOWN_MEMBER_ID)."""
    app_spec = TxnAppSpec({"t": 1}, True, 5, 60_000)
    sim = _simulation(app_spec)
    seen: dict[str, Any] = {}

    async def story() -> None:
        instance, app = await _loaded(sim, app_spec)
        joined = await sim.call("member", "m-1", "consumer_group_heartbeat", HeartbeatRequest(
            app.group_id, "m-1", 0, rebalance_timeout_ms=30_000, subscribed_topic_names=("other",), owned=()))
        assert joined.error == Errors.NONE, joined
        await app._init()
        old_epoch = app.epoch
        await app._init()  # a new epoch of the same producer id
        sim.kafka.faults.land_ms = (2_000, 2_000)  # the producer's batch in flight for 2 s holds its lock
        in_flight = instance.serve("txn_offset_commit", txn_offset_commit_request(
            5, app.transactional_id, app.group_id, app.producer_id, app.epoch, {("t", 0): 7},
            generation_id=int(joined.member_epoch), member_id="m-1"), app.name, "")
        await asyncio.sleep(0.5)  # virtual: its Produce is on its way
        sim.kafka.faults.land_ms = KafkaFaults().land_ms
        assert sim.relay is not None
        asked = len(sim.relay.verifications)
        late = instance.serve("txn_offset_commit", txn_offset_commit_request(
            3, app.transactional_id, app.group_id, app.producer_id, old_epoch, {("t", 0): 5},
            generation_id=int(joined.member_epoch), member_id="m-1"), "zombie", "")
        await asyncio.sleep(0.1)
        seen["waiting_for_the_lock"] = not late.done() and not in_flight.done()
        left = await sim.call("member", "m-1", "consumer_group_heartbeat", HeartbeatRequest(
            app.group_id, "m-1", LEAVE_GROUP_MEMBER_EPOCH))
        seen["left"] = left.error
        seen["in_flight"] = _error(await asyncio.wait_for(in_flight, 10))
        seen["late"] = _error(await asyncio.wait_for(late, 10))
        seen["verified_late"] = len(sim.relay.verifications) - asked

    run_story(sim, story())
    assert seen == {"waiting_for_the_lock": True, "left": Errors.NONE, "in_flight": Errors.NONE,
                    "late": Errors.INVALID_PRODUCER_EPOCH, "verified_late": 1}, seen
    assert sim.checkers.violations == []
