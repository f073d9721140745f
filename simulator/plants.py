"""Planted bugs: small mutations of the production code, each of which the simulator must find within a few
dozen seeds (tests/unit/test_simulator.py). `python -m simulator --plant NAME` runs seeds with one in place.

Each plant patches the production code only inside its `with` block and names the invariants expected to catch it.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from coordinator.cluster.ownership import Ownership, ZombieGuard
from coordinator.group import sync
from coordinator.group.metadata import GroupMetadata
from coordinator.group.modern import reconciliation
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.service import ConsumerGroupService
from coordinator.group.runtime import GroupRuntime
from coordinator.group import txn_offsets
from coordinator.group.shard import GroupShard
from coordinator.server.handlers import txn_offset_commit
from coordinator.storage.transaction_log import TransactionTracker
from protocol.fetch_reader import MarkerType
from protocol.error_codes import Errors


@dataclass(frozen=True)
class Plant:
    name: str
    description: str
    caught_by: frozenset[str]
    patch: Callable[[], Iterator[None]]
    protocol: str = "classic"  # what the groups must speak for the bug to show (simulator/run.py make_scenario)


def _answer_before_ack() -> Iterator[None]:
    async def written_at_once(self: GroupRuntime, done: list[asyncio.Future[Errors]]) -> list[Errors]:
        return [Errors.NONE] * len(done)

    with _patched(GroupRuntime, "_written", written_at_once):
        yield


def _generation_not_bumped() -> Iterator[None]:
    bump = GroupMetadata.init_next_generation

    def init_without_bump(self: GroupMetadata, now_ms: int) -> None:
        bump(self, now_ms)
        if self.generation_id > 2:
            self.generation_id -= 1

    with _patched(GroupMetadata, "init_next_generation", init_without_bump):
        yield


def _early_session_expiry() -> Iterator[None]:
    schedule = GroupShard.schedule_heartbeat

    def two_thirds(self: GroupShard, group: Any, member: Any, timeout_ms: int) -> None:
        schedule(self, group, member, timeout_ms * 2 // 3)

    with _patched(GroupShard, "schedule_heartbeat", two_thirds):
        yield


def _offsets_cached_on_failure() -> Iterator[None]:
    finish = GroupMetadata.finish_offset_commit

    def always_ok(self: GroupMetadata, offsets: Any, version: int, ok: bool) -> None:
        finish(self, offsets, version, True)

    with _patched(GroupMetadata, "finish_offset_commit", always_ok):
        yield


def _assignment_failure_ignored() -> Iterator[None]:
    stored = sync._on_assignment_stored

    def as_if_stored(shard: Any, group: Any, generation_id: int, leader_id: str, assignment: Any,
                     error: Errors) -> None:
        stored(shard, group, generation_id, leader_id, assignment, Errors.NONE)

    with _patched(sync, "_on_assignment_stored", as_if_stored):
        yield


def _revoke_keeps_serving() -> Iterator[None]:
    async def kept(self: Ownership, partitions: set[int]) -> None:
        return None

    with _patched(Ownership, "on_revoked", kept):
        yield


def _zombie_guard_off() -> Iterator[None]:
    def never(self: ZombieGuard) -> None:
        return None

    with _patched(ZombieGuard, "expired", never):
        yield


def _revocation_not_awaited() -> Iterator[None]:
    def revoked(owned: Any, revoking: Any) -> bool:
        return False

    with _patched(reconciliation, "_still_owns", revoked):
        yield


def _pending_revocation_unheld() -> Iterator[None]:
    put = ConsumerGroup._put_member

    def without_pending(self: ConsumerGroup, member: Any) -> None:
        put(self, member)
        for topic_id, partitions in member.pending_revocation.items():
            for partition in partitions:
                self._partition_epochs.pop((topic_id, partition), None)

    with _patched(ConsumerGroup, "_put_member", without_pending):
        yield


def _member_epoch_not_bumped() -> Iterator[None]:
    step = reconciliation._next

    def kept_epoch(member: Any, member_epoch: int, target_epoch: int, *rest: Any) -> Any:
        moved = step(member, member_epoch, target_epoch, *rest)
        if member.member_epoch > 0 and moved.member_epoch > member.member_epoch:
            return moved.replace(member_epoch=member.member_epoch,
                                 previous_member_epoch=member.previous_member_epoch)
        return moved

    with _patched(reconciliation, "_next", kept_epoch):
        yield


def _consumer_session_not_rearmed() -> Iterator[None]:
    schedule = ConsumerGroupService.schedule_session

    def once(self: ConsumerGroupService, group_id: str, member_id: str) -> None:
        if ("session", group_id, member_id) not in self._timers:
            schedule(self, group_id, member_id)

    with _patched(ConsumerGroupService, "schedule_session", once):
        yield


def _aborted_offsets_loaded() -> Iterator[None]:
    feed = TransactionTracker.feed

    def aborts_applied(self: TransactionTracker, batch: Any) -> None:
        if batch.is_control and batch.marker == MarkerType.ABORT:
            batch = dataclasses.replace(batch, marker=MarkerType.COMMIT)
        feed(self, batch)

    with _patched(TransactionTracker, "feed", aborts_applied):
        yield


def _pending_current_before_marker() -> Iterator[None]:
    replay = txn_offsets.replay_transactional_offsets

    def current_at_once(shard: GroupShard, producer_id: int, producer_epoch: int, records: Any, *,
                        transactional_id: str | None = None) -> None:
        replay(shard, producer_id, producer_epoch, records, transactional_id=transactional_id)
        for log_offset, record in records:
            group = shard.groups.get(record.group_id)
            if group is not None and record.value is not None:
                group.offsets[(record.topic, record.partition)] = dataclasses.replace(record.value,
                                                                                      log_offset=log_offset)

    with _patched(txn_offsets, "replay_transactional_offsets", current_at_once), \
            _patched(txn_offset_commit, "replay_transactional_offsets", current_at_once):
        yield


def _abort_marker_commits() -> Iterator[None]:
    end = txn_offsets.replay_end_transaction

    def always_commits(shard: GroupShard, producer_id: int, producer_epoch: int, commit: bool, log_offset: int) -> int:
        return end(shard, producer_id, producer_epoch, True, log_offset)

    with _patched(txn_offsets, "replay_end_transaction", always_commits):
        yield


def _verification_ignored() -> Iterator[None]:
    verify = txn_offset_commit.answer_after_verification

    async def group_error_stands(relay: Any, identity: Any, state: tuple[str, int], group_error: Errors) -> Errors:
        await verify(relay, identity, state, group_error)
        return group_error

    with _patched(txn_offset_commit, "answer_after_verification", group_error_stands):
        yield


def _pending_offsets_unreported() -> Iterator[None]:
    def nothing_pending(self: txn_offsets.TransactionalOffsets, group_id: str, tp: Any) -> bool:
        return False

    with _patched(txn_offsets.TransactionalOffsets, "has_pending", nothing_pending):
        yield


PLANTS = {plant.name: plant for plant in (
    Plant("answer_before_ack", "writes are reported acknowledged at once: answers go out before Kafka's ack",
          frozenset({"answer_after_ack"}), _answer_before_ack),
    Plant("generation_not_bumped", "a rebalance past generation 2 keeps the old generation number",
          frozenset({"generation_once", "single_owner", "no_errors"}), _generation_not_bumped),
    Plant("early_session_expiry", "sessions are armed for two thirds of session.timeout.ms",
          frozenset({"session_expiry"}), _early_session_expiry),
    Plant("offsets_cached_on_failure", "the offset cache takes a commit whose write failed",
          frozenset({"reload_equals_acked", "durable_commit"}), _offsets_cached_on_failure),
    Plant("assignment_failure_ignored", "a leader's assignment whose write failed is handed out anyway",
          frozenset({"answer_after_ack", "reload_equals_acked"}), _assignment_failure_ignored),
    Plant("revoke_keeps_serving", "an instance told to give a state partition up keeps serving it",
          frozenset({"single_writer"}), _revoke_keeps_serving),
    Plant("zombie_guard_off", "a paused instance does not notice its pause and serves what moved meanwhile",
          frozenset({"single_writer"}), _zombie_guard_off),
    # the consumer protocol's (run with --protocol consumer)
    Plant("revocation_not_awaited", "a partition to revoke counts as revoked at once: it goes to its new member "
          "before its owner acknowledged the revocation", frozenset({"consumer_owner"}), _revocation_not_awaited, "consumer"),
    Plant("pending_revocation_unheld", "a partition pending revocation is not held by its owner: it is free for "
          "the next member", frozenset({"consumer_owner"}), _pending_revocation_unheld, "consumer"),
    Plant("member_epoch_not_bumped", "a member that reconciles keeps its epoch instead of moving to the target's",
          frozenset({"member_epoch"}), _member_epoch_not_bumped, "consumer"),
    Plant("consumer_session_not_rearmed", "a heartbeat does not restart the member's session: it runs out from "
          "the join", frozenset({"session_expiry"}), _consumer_session_not_rearmed, "consumer"),
    # clients' transactions (TxnOffsetCommit, the markers, the loader)
    Plant("aborted_offsets_loaded", "the loader applies the offsets of an aborted client transaction as if it "
          "committed", frozenset({"txn_offsets"}), _aborted_offsets_loaded),
    Plant("pending_current_before_marker", "a transactional offset becomes current when its batch is "
          "acknowledged, before its transaction's marker", frozenset({"txn_offsets"}),
          _pending_current_before_marker),
    Plant("pending_offsets_unreported", "a require_stable OffsetFetch does not see a transaction's pending offset: "
          "answered as if stable instead of UNSTABLE_OFFSET_COMMIT", frozenset({"txn_offsets"}),
          _pending_offsets_unreported),
    Plant("abort_marker_commits", "the partition tail settles an ABORT marker as a COMMIT",
          frozenset({"txn_offsets"}), _abort_marker_commits),
    Plant("verification_ignored", "a TxnOffsetCommit the group refuses is answered with the group's error even "
          "when the transaction coordinator refused the transaction", frozenset({"txn_verification"}),
          _verification_ignored),
)}


@contextlib.contextmanager
def planted(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    with contextlib.contextmanager(PLANTS[name].patch)():
        yield


@contextlib.contextmanager
def _patched(owner: Any, attribute: str, replacement: Any) -> Iterator[None]:
    original = getattr(owner, attribute)
    setattr(owner, attribute, replacement)
    try:
        yield
    finally:
        setattr(owner, attribute, original)
