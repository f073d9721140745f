"""The transaction check before the group's (TxnOffsetCommit): DescribeTransactions read by hand (kio refuses the
start time -1 of a transaction not started) and the transaction coordinator's answer per case and version. The
answers against Kafka 4.1.1 itself: tests/integration/test_txn_offset_commit_verification.py."""
from __future__ import annotations

import datetime
import struct

import pytest

from coordinator.group.txn_commit import DescribedTransaction, TxnOffsetCommitIdentity, verification_error
from coordinator.relay.errors import UpstreamUnavailable
from coordinator.server.handlers.txn_verification import read_described_transaction, unverified_append_error
from protocol.codec import encode_response_frame
from protocol.error_codes import Errors
from protocol.errors import ProtocolError
from protocol.messages import build, error, item_class
from protocol.apis import response_class

STATE = ("__state", 2)
_START = datetime.datetime(2026, 11, 27, tzinfo=datetime.timezone.utc)


def _frame(code: Errors, state: str = "Ongoing", topics: dict[str, tuple[int, ...]] | None = None) -> bytes:
    """A DescribeTransactions v0 response frame as the client receives it (size prefix removed)."""
    cls = response_class(65, 0)
    state_class = item_class(cls, "transaction_states")
    topic_class = item_class(state_class, "topics")
    body = build(cls, throttle_time=datetime.timedelta(0), transaction_states=(state_class(
        error_code=error(code), transactional_id="app", transaction_state=state,
        transaction_timeout=datetime.timedelta(seconds=60), transaction_start_time=_START, producer_id=7,
        producer_epoch=3, topics=tuple(topic_class(topic=t, partitions=p) for t, p in (topics or {}).items())),))
    return encode_response_frame(11, 1, body)[4:]


def test_a_described_transaction_is_read_by_hand() -> None:
    frame = _frame(Errors.NONE, topics={"out": (0, 1), STATE[0]: (STATE[1],)})
    assert read_described_transaction(frame) == (Errors.NONE, DescribedTransaction(
        7, 3, "Ongoing", frozenset({("out", 0), ("out", 1), STATE})))
    # not started: its start time -1, which kio's reader refuses
    start = frame.index(struct.pack(">q", int(_START.timestamp() * 1000)))
    unstarted = frame[:start] + struct.pack(">q", -1) + frame[start + 8:]
    assert read_described_transaction(unstarted) == read_described_transaction(frame)
    assert read_described_transaction(_frame(Errors.TRANSACTIONAL_ID_NOT_FOUND)) == \
        (Errors.TRANSACTIONAL_ID_NOT_FOUND, None)


@pytest.mark.parametrize("cut", [5, 12, 30, -3])
def test_a_truncated_answer_is_refused(cut: int) -> None:
    frame = _frame(Errors.NONE, topics={"out": (0, 1)})
    with pytest.raises((ValueError, IndexError, struct.error, ProtocolError)):
        read_described_transaction(frame[:cut])


def test_a_length_past_the_frame_is_refused() -> None:
    frame = bytearray(_frame(Errors.NONE))
    frame[9] = 0x7F  # the states array's compact length (after correlation id, header tags, throttle time)
    with pytest.raises(ValueError):
        read_described_transaction(bytes(frame))


def _request(version: int, *, epoch: int = 3, producer_id: int = 7) -> TxnOffsetCommitIdentity:
    return TxnOffsetCommitIdentity("app", producer_id, epoch, "g", version=version)


def test_the_transaction_coordinators_answer_before_the_groups() -> None:
    added = DescribedTransaction(7, 3, "Ongoing", frozenset({STATE}))
    empty = DescribedTransaction(7, 3, "Empty", frozenset())
    for version in range(6):
        assert verification_error(added, _request(version), STATE) is None
        assert verification_error(None, _request(version), STATE) == Errors.INVALID_PRODUCER_ID_MAPPING
        assert verification_error(added, _request(version, producer_id=8), STATE) == \
            Errors.INVALID_PRODUCER_ID_MAPPING
        assert verification_error(added, _request(version, epoch=2), STATE) == Errors.INVALID_PRODUCER_EPOCH
        completing = DescribedTransaction(7, 3, "PrepareCommit", frozenset({STATE}))
        assert verification_error(completing, _request(version), STATE) == Errors.CONCURRENT_TRANSACTIONS
    # v0-4 only verify that the partition is in the transaction; v5 adds it
    assert [verification_error(empty, _request(version), STATE) for version in range(6)] == \
        [Errors.TRANSACTION_ABORTABLE] * 5 + [None]


class _Cluster:
    """The cluster's side of a verification as the relay hands it back: FindCoordinator names broker 1, whose
    DescribeTransactions frame is `frame` (None: the cluster does not answer)."""

    def __init__(self, frame: bytes | None) -> None:
        self.frame = frame

    async def request(self, body: object) -> object:
        cls = response_class(10, 4)
        entry = item_class(cls, "coordinators")(key="app", node_id=1, host="b1", port=9092,
                                                error_code=error(Errors.NONE), error_message=None)
        return build(cls, throttle_time=datetime.timedelta(0), coordinators=(entry,))

    async def request_to(self, node_id: int, body: object, *, undecoded: bool = False) -> bytes:
        assert node_id == 1 and undecoded
        if self.frame is None:
            raise UpstreamUnavailable("broker 1 did not answer")
        return self.frame


@pytest.mark.parametrize("version", range(6))
async def test_an_append_the_leader_could_not_verify_is_answered_with_the_verifications_error(version: int) -> None:
    """The leader answers a Produce whose verification failed retriably NOT_ENOUGH_REPLICAS; Kafka's group
    coordinator gets the verification's own error (CONCURRENT_TRANSACTIONS while the transaction completes)."""
    completing = _frame(Errors.NONE, "PrepareCommit", {STATE[0]: (STATE[1],)})
    assert await unverified_append_error(_Cluster(completing), _request(version), STATE) == \
        Errors.CONCURRENT_TRANSACTIONS
    ongoing = _frame(Errors.NONE, "Ongoing", {STATE[0]: (STATE[1],)})  # nothing wrong: replicas are missing
    assert await unverified_append_error(_Cluster(ongoing), _request(version), STATE) == Errors.NOT_ENOUGH_REPLICAS
    assert await unverified_append_error(_Cluster(None), _request(version), STATE) == \
        Errors.COORDINATOR_NOT_AVAILABLE
