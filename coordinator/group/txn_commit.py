"""TxnOffsetCommit (28): the KIP-447 checks (Kafka's OffsetMetadataManager.validateTransactionalOffsetCommit with
the groups' validateOffsetCommit, isTransactional=true) and how a refused transactional append is answered per
version, and what the transaction coordinator's verification answers when the group refuses. The append itself is the
client's transaction's (txn_offsets.py holds what it carried until its marker)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.group.api import UNKNOWN_MEMBER_ID
from coordinator.group.errors import kafka4_append_error
from coordinator.group.metadata import GroupMetadata
from coordinator.group.modern.offsets import validate_offset_commit
from coordinator.group.offsets import validate_commit_member
from protocol.error_codes import Errors

if TYPE_CHECKING:
    from coordinator.group.shard import GroupShard

# The version that added TRANSACTION_ABORTABLE to TxnOffsetCommit's answers (KIP-890 part 1)
TRANSACTION_ABORTABLE_MIN_VERSION = 4
# TxnOffsetCommit v5 (KIP-890 part 2): the group's partition is added to the transaction, not only verified
ADDING_MIN_VERSION = 5
# Group refusals Kafka answers before it has the transaction verified (GroupCoordinatorService's own checks, and
# the offsets partition not led here); every other refusal comes after the verification
ANSWERED_BEFORE_VERIFICATION = frozenset((Errors.INVALID_GROUP_ID, Errors.NOT_COORDINATOR,
                                          Errors.COORDINATOR_NOT_AVAILABLE))
_COMPLETING = frozenset(("PrepareCommit", "PrepareAbort"))


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitIdentity:
    """Who commits: the transaction and the group member (v0-2 carry no member: generation -1, member "")."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    generation_id: int = -1
    member_id: str = UNKNOWN_MEMBER_ID
    group_instance_id: str | None = None
    version: int = 3


@dataclass(frozen=True, slots=True)
class DescribedTransaction:
    """The transaction coordinator's view of a transactional id (DescribeTransactions)."""

    producer_id: int
    producer_epoch: int
    state: str
    partitions: frozenset[tuple[str, int]]


def verification_error(described: DescribedTransaction | None, req: TxnOffsetCommitIdentity,
                       partition: tuple[str, int]) -> Errors | None:
    """What the transaction coordinator answers the group coordinator's check of `partition` (ours: the group's
    state partition) for this request before the group is looked at (TransactionCoordinator
    handleVerifyPartitionsInTransaction for v0-4, handleAddPartitionsToTransaction for v5, which adds it), as
    AddPartitionsToTxnManager hands it on (PRODUCER_FENCED → INVALID_PRODUCER_EPOCH), before the per-version
    mapping of `txn_append_error`. `described` None: no such transactional id."""
    if described is None or described.producer_id != req.producer_id:
        return Errors.INVALID_PRODUCER_ID_MAPPING
    if described.producer_epoch != req.producer_epoch:
        return Errors.INVALID_PRODUCER_EPOCH
    if described.state in _COMPLETING:
        return Errors.CONCURRENT_TRANSACTIONS
    if req.version < ADDING_MIN_VERSION and partition not in described.partitions:
        return Errors.TRANSACTION_ABORTABLE
    return None


def validate_transactional_offset_commit(shard: GroupShard, req: TxnOffsetCommitIdentity
                                         ) -> tuple[GroupMetadata | None, Errors | None]:
    """The group the offsets go to (created as a simple group when unknown and the generation is < 0), or the
    error every partition is answered with."""
    error = shard.group_status_error(req.group_id)
    if error is not None:
        return None, error
    consumer_group = shard.consumer_groups.get(req.group_id)
    if consumer_group is not None:
        error = validate_offset_commit(consumer_group, req.member_id, req.generation_id, req.version,
                                       transactional=True)
        if error == Errors.STALE_MEMBER_EPOCH:  # what a transactional producer understands
            error = Errors.ILLEGAL_GENERATION
        return (None, error) if error is not None else (shard.add_group(req.group_id), None)
    group = shard.groups.get(req.group_id)
    if group is None:
        if req.generation_id >= 0:
            return None, Errors.ILLEGAL_GENERATION
        return shard.add_group(req.group_id), None
    error = _validate_classic(shard, group, req)
    return (None, error) if error is not None else (group, None)


def _validate_classic(shard: GroupShard, group: GroupMetadata, req: TxnOffsetCommitIdentity) -> Errors | None:
    """ClassicGroup.validateOffsetCommit with isTransactional: no member is needed (old versions have none) and
    a rebalance in progress does not refuse the commit."""
    return validate_commit_member(shard, group, req.generation_id, req.member_id, req.group_instance_id,
                                  "txn-offset-commit", without_member=None)


def txn_append_error(error: Errors, version: int) -> Errors:
    """A refused transactional append as TxnOffsetCommit `version` answers it: the coordinator errors of Kafka 4
    (GroupCoordinatorService.handleOperationException), and the verification errors older clients know
    (AddPartitionsToTxnManager: TRANSACTION_ABORTABLE → INVALID_TXN_STATE, PRODUCER_FENCED →
    INVALID_PRODUCER_EPOCH before v4)."""
    if version < TRANSACTION_ABORTABLE_MIN_VERSION:
        if error == Errors.TRANSACTION_ABORTABLE:
            return Errors.INVALID_TXN_STATE
        if error == Errors.PRODUCER_FENCED:
            return Errors.INVALID_PRODUCER_EPOCH
    return kafka4_append_error(error)
