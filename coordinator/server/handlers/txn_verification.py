"""The transaction check that comes before the group's (not a handler of its own: TxnOffsetCommit's).

Kafka's group coordinator has the transaction verified by the transaction coordinator (v0–4: is the group's
offsets partition in it; v5: add it) before its write operation looks at the group (CoordinatorRuntime
`scheduleTransactionalWriteOperation`), so a transaction error wins over a group error: a v3 request without
AddOffsetsToTxn from a fenced static member is answered INVALID_TXN_STATE, not FENCED_INSTANCE_ID. Ours is
verified by the leader of our state partition when the batch is appended, which comes after the group's checks;
so when the group refuses, we ask the transaction coordinator (DescribeTransactions: our principal's WRITE on the
transactional id, which the append needs anyway, implies DESCRIBE) and answer its error first. A v5 request
it does not refuse gets the state partition added, as Kafka's verification added its offsets partition before
the group refused it (AddPartitionsToTxn as brokers send it; needs CLUSTER_ACTION where ACLs are enforced, else
logged). The path that appends is unchanged: the leader's own verification answers there.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from typing import Any

from coordinator.group.txn_commit import (ADDING_MIN_VERSION, ANSWERED_BEFORE_VERIFICATION, DescribedTransaction,
                                          TxnOffsetCommitIdentity, txn_append_error, verification_error)
from coordinator.relay.errors import UpstreamUnavailable
from protocol import codec
from protocol.apis import ApiKey, request_class
from protocol.error_codes import Errors
from protocol.errors import ProtocolError
from protocol.messages import build, item_class
from protocol.retry import doubling_pauses

_FIND_COORDINATOR_VERSION, _TRANSACTION_KEY = 4, 1
_DESCRIBE_TRANSACTIONS, _DESCRIBE_TRANSACTIONS_VERSION = 65, 0
_ADD_PARTITIONS_BROKER_VERSION = 5  # Kafka 4.1's AddPartitionsToTxnManager: above 3, a TV2 add
# the transaction coordinator is moving or loading: the client retries (Kafka's verification would wait it out)
_RETRIABLE = frozenset((Errors.NOT_COORDINATOR, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                        Errors.COORDINATOR_NOT_AVAILABLE))

# A request refused only because the client's transaction is busy for a moment (its last transaction's markers
# still being written; two verifications of one transactional id meeting in a broker's AddPartitionsToTxnManager,
# the older answered NETWORK_EXCEPTION, which a Produce reports as NOT_ENOUGH_REPLICAS) is sent again after 1 ms,
# doubling to 20 ms, for at most 1 s, as Kafka's brokers retry their own server-side adds
# (add.partitions.to.txn.retry.backoff.ms): answered to the client instead, it costs a tight exactly-once loop the
# client's backoff (librdkafka: 100 ms on AddOffsetsToTxn, a fixed 500 ms on TxnOffsetCommit).
BUSY_RETRY_FIRST_S, BUSY_RETRY_MAX_S, BUSY_RETRY_BUDGET_S = 0.001, 0.020, 1.0

log = logging.getLogger("coordinator.server")


def busy_retry_pauses() -> Iterator[float]:
    """The pauses before each retry of a request refused as busy (above), until the budget is spent."""
    return doubling_pauses(BUSY_RETRY_FIRST_S, BUSY_RETRY_MAX_S, budget_s=BUSY_RETRY_BUDGET_S)


class _Unverifiable(Exception):
    def __init__(self, error: Errors) -> None:
        super().__init__(error.name)
        self.error = error


async def answer_after_verification(relay: Any, identity: TxnOffsetCommitIdentity, state: tuple[str, int],
                                    group_error: Errors) -> Errors:
    """The answer to a request the group refused with `group_error`: the verification's error if the transaction
    coordinator refuses it, else `group_error`."""
    if group_error in ANSWERED_BEFORE_VERIFICATION:
        return group_error
    verified = await _verified(relay, identity, state, group_error)
    if verified is None and identity.version >= ADDING_MIN_VERSION:
        await _add_state_partition(relay, identity, state)
    return group_error if verified is None else txn_append_error(verified, identity.version)


async def unverified_append_error(relay: Any, identity: TxnOffsetCommitIdentity, state: tuple[str, int]
                                  ) -> Errors:
    """What refused an append the leader answered NOT_ENOUGH_REPLICAS: the leader's Produce path answers so for a
    verification it could not complete (CONCURRENT_TRANSACTIONS while the transaction completes, a coordinator
    moving), for producers to retry; Kafka's group coordinator gets the verification's own error, so ours comes
    from the transaction coordinator too. NOT_ENOUGH_REPLICAS when it finds nothing wrong (replicas missing)."""
    verified = await _verified(relay, identity, state, Errors.NOT_ENOUGH_REPLICAS)
    return Errors.NOT_ENOUGH_REPLICAS if verified is None else verified


async def _verified(relay: Any, identity: TxnOffsetCommitIdentity, state: tuple[str, int],
                    otherwise: Errors) -> Errors | None:
    """The transaction coordinator's error for this request (before the per-version mapping); None if it has
    none or cannot say (logged; `otherwise` is answered then), COORDINATOR_NOT_AVAILABLE while it moves."""
    try:
        described = await _describe(relay, identity.transactional_id)
    except _Unverifiable as exc:
        if exc.error in _RETRIABLE:
            return Errors.COORDINATOR_NOT_AVAILABLE
        log.warning("event=txn_verification_refused transactional_id=%s error=%s answered=%s",
                    identity.transactional_id, exc.error.name, otherwise.name)
        return None
    return verification_error(described, identity, state)


async def _add_state_partition(relay: Any, identity: TxnOffsetCommitIdentity, state: tuple[str, int]) -> None:
    """The group's state partition added to the transaction as a broker adds it (AddPartitionsToTxn v5, not
    verify-only: Kafka's v5 verification adds the offsets partition before the group refuses the request, so the
    transaction is Ongoing with it either way). A refusal is logged: the answer is the group's all the same."""
    cls = request_class(ApiKey.ADD_PARTITIONS_TO_TXN, _ADD_PARTITIONS_BROKER_VERSION)
    transaction = item_class(cls, "transactions")
    add = build(cls, transactions=(transaction(
        transactional_id=identity.transactional_id, producer_id=identity.producer_id,
        producer_epoch=identity.producer_epoch, verify_only=False,
        topics=(item_class(transaction, "topics")(name=state[0], partitions=(state[1],)),)),))
    try:
        answer = await relay.request_to(await _coordinator_node(relay, identity.transactional_id), add)
    except (_Unverifiable, UpstreamUnavailable) as exc:
        log.warning("event=txn_state_partition_not_added transactional_id=%s partition=%s error=%s",
                    identity.transactional_id, state, exc)
        return
    codes = {error_code(answer.error_code)} | {
        error_code(partition.partition_error_code) for result in answer.results_by_transaction
        for topic in result.topic_results for partition in topic.results_by_partition}
    if codes != {Errors.NONE}:
        log.warning("event=txn_state_partition_not_added transactional_id=%s partition=%s error=%s",
                    identity.transactional_id, state, ",".join(sorted(code.name for code in codes)))
        return
    log.info("event=txn_state_partition_added_to_refused_commit transactional_id=%s producer_id=%d group=%s "
             "partition=%s", identity.transactional_id, identity.producer_id, identity.group_id, state)


async def _coordinator_node(relay: Any, transactional_id: str) -> int:
    """The node id of the id's transaction coordinator (FindCoordinator through the relay)."""
    find = request_class(ApiKey.FIND_COORDINATOR, _FIND_COORDINATOR_VERSION)
    found = (await relay.request(build(find, key_type=_TRANSACTION_KEY,
                                       coordinator_keys=(transactional_id,)))).coordinators[0]
    if error_code(found.error_code) != Errors.NONE:
        raise _Unverifiable(error_code(found.error_code))
    return int(found.node_id)


async def _describe(relay: Any, transactional_id: str) -> DescribedTransaction | None:
    """DescribeTransactions at the id's transaction coordinator; None if it has no such id."""
    describe = request_class(_DESCRIBE_TRANSACTIONS, _DESCRIBE_TRANSACTIONS_VERSION)
    try:
        frame = await relay.request_to(await _coordinator_node(relay, transactional_id),
                                       build(describe, transactional_ids=(transactional_id,)), undecoded=True)
    except UpstreamUnavailable as exc:
        log.warning("event=txn_verification_unanswered transactional_id=%s error=%s", transactional_id, exc)
        raise _Unverifiable(Errors.COORDINATOR_NOT_AVAILABLE) from exc
    try:
        code, described = read_described_transaction(frame)
    except (ValueError, IndexError, struct.error, ProtocolError) as exc:
        log.warning("event=txn_verification_malformed transactional_id=%s error=%r", transactional_id, exc)
        raise _Unverifiable(Errors.UNKNOWN_SERVER_ERROR) from None
    if code == Errors.TRANSACTIONAL_ID_NOT_FOUND:
        return None
    if code != Errors.NONE or described is None:
        raise _Unverifiable(code)
    return described


class _Frame:
    """A bounded reader of a flexible-version response (compact strings and arrays, tagged fields skipped)."""

    def __init__(self, frame: bytes, offset: int) -> None:
        self.frame, self.offset = frame, offset

    def fixed(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.frame, self.offset)
        self.offset += struct.calcsize(fmt)
        return int(value)

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.frame[self.offset]
            self.offset += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 28:
                raise ValueError("varint longer than five bytes")

    def length(self) -> int:
        """A compact length: -1 for null; never more than the bytes left (each element takes one at least)."""
        length = self.uvarint() - 1
        if length > len(self.frame) - self.offset:
            raise ValueError(f"length {length} past the frame's end")
        return length

    def string(self) -> str:
        length = self.length()
        if length < 0:
            return ""
        self.offset += length
        return self.frame[self.offset - length:self.offset].decode()

    def tags(self) -> None:
        self.offset = codec.skip_tagged_fields(self.frame, self.offset)


def read_described_transaction(frame: bytes) -> tuple[Errors, DescribedTransaction | None]:
    """The first transaction state of a DescribeTransactions v0 response frame (correlation id first), read by
    hand: kio's reader refuses the start time -1 of a transaction that has not started."""
    reader = _Frame(frame, 4)
    reader.tags()  # the response header
    reader.fixed(">i")  # throttle time
    if reader.length() < 1:
        raise ValueError("no transaction state in the answer")
    code = error_code(reader.fixed(">h"))
    reader.string()  # the transactional id
    state = reader.string()
    reader.fixed(">i")  # timeout
    reader.fixed(">q")  # start time
    producer_id, producer_epoch = reader.fixed(">q"), reader.fixed(">h")
    partitions: set[tuple[str, int]] = set()
    for _ in range(max(reader.length(), 0)):
        topic = reader.string()
        partitions.update((topic, reader.fixed(">i")) for _ in range(max(reader.length(), 0)))
        reader.tags()
    if code != Errors.NONE:
        return code, None
    return code, DescribedTransaction(producer_id, producer_epoch, state, frozenset(partitions))


def error_code(value: int) -> Errors:
    """An error code as Errors (one this table does not name is still an error)."""
    try:
        return Errors(int(value))
    except ValueError:
        return Errors.UNKNOWN_SERVER_ERROR
