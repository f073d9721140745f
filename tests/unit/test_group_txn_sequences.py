"""The sequences we write a client producer's transactional batches with (ProducerAppendInfo's rules as the
partition leader applies them to us)."""
from __future__ import annotations

import pytest

from coordinator.group.txn_sequences import Busy, Outcome, ProducerSequences

PID = 7000


def test_a_new_producer_or_epoch_starts_at_zero_and_each_acknowledged_batch_advances_by_its_records() -> None:
    sequences = ProducerSequences()
    assert sequences.claim(PID + 2, 0, 3) == 0
    sequences.settle(PID + 2, 0, 0, Outcome.ACKNOWLEDGED)
    assert sequences.next_sequence(PID + 2, 0) == 3
    assert sequences.claim(PID, 0, 1) == 0
    sequences.settle(PID, 0, 0, Outcome.ACKNOWLEDGED)
    assert sequences.claim(PID, 0, 1) == 1
    sequences.settle(PID, 0, 1, Outcome.ACKNOWLEDGED)
    assert sequences.claim(PID, 1, 1) == 0  # TV2's next transaction: a bumped epoch
    sequences.settle(PID, 1, 0, Outcome.ACKNOWLEDGED)
    assert sequences.next_sequence(PID, 1) == 1 and sequences.next_sequence(PID + 1, 0) == 0


def test_one_batch_in_flight_and_a_refused_one_does_not_advance() -> None:
    sequences = ProducerSequences()
    assert sequences.claim(PID, 3, 1) == 0
    with pytest.raises(Busy):
        sequences.claim(PID, 3, 1)
    assert sequences.claim(PID + 1, 0, 1) == 0  # other producers are not held
    sequences.settle(PID, 3, 0, Outcome.REFUSED)
    assert sequences.claim(PID, 3, 1) == 0


def test_a_batch_of_unknown_outcome_is_owed_again_with_its_sequence_before_anything_else() -> None:
    sequences = ProducerSequences()
    sequences.claim(PID, 0, 1)
    sequences.settle(PID, 0, 0, Outcome.ACKNOWLEDGED)
    assert sequences.claim(PID, 0, 1) == 1
    sequences.settle(PID, 0, 1, Outcome.UNKNOWN)
    with pytest.raises(Busy):
        sequences.claim(PID, 0, 1)
    assert sequences.claim_resend(PID) == 1
    sequences.settle(PID, 0, 1, Outcome.ACKNOWLEDGED)  # the broker answered the duplicate with its offset
    assert sequences.claim_resend(PID) is None and sequences.claim(PID, 0, 1) == 2


def test_the_log_wins_after_a_failover_and_a_marker_of_a_higher_epoch_restarts() -> None:
    sequences = ProducerSequences()
    sequences.observed_batch(PID, 2, 4)  # the load read sequence 4 of epoch 2
    assert sequences.claim(PID, 2, 1) == 5
    sequences.settle(PID, 2, 5, Outcome.UNKNOWN)
    sequences.observed_batch(PID, 2, 5)  # the tail read it: it landed
    assert sequences.claim_resend(PID) is None and sequences.claim(PID, 2, 1) == 6
    sequences.settle(PID, 2, 6, Outcome.ACKNOWLEDGED)
    sequences.observed_marker(PID, 2)  # TV1: same epoch, the sequence continues
    assert sequences.next_sequence(PID, 2) == 7
    sequences.observed_marker(PID, 3)  # a fence or TV2's bump
    assert sequences.next_sequence(PID, 3) == 0


def test_a_lower_epoch_is_left_to_the_broker_and_changes_nothing() -> None:
    sequences = ProducerSequences()
    sequences.observed_batch(PID, 5, 0)
    assert sequences.claim(PID, 4, 1) == 0
    sequences.settle(PID, 4, 0, Outcome.ACKNOWLEDGED)
    assert sequences.next_sequence(PID, 5) == 1 and sequences.claim(PID, 5, 1) == 1


def test_an_acknowledgement_never_takes_the_sequence_behind_what_the_log_showed_meanwhile() -> None:
    """Seed 55234: a batch claimed on a table the load had not filled yet (sequence 0), the load then reporting the
    producer's batch up to sequence 4, and the claimed batch acknowledged (as a duplicate): the next batch is 5,
    not 1 (1-4 would each be answered as duplicates of batches already in the log, nothing appended)."""
    sequences = ProducerSequences()
    assert sequences.claim(7, 8, 1) == 0
    sequences.observed_batch(7, 8, 4)
    sequences.settle(7, 8, 0, Outcome.ACKNOWLEDGED)
    assert sequences.next_sequence(7, 8) == 5


def test_forgetting_the_partition_counts_its_lives() -> None:
    sequences = ProducerSequences()
    life = sequences.forgotten
    sequences.forget()
    assert sequences.forgotten == life + 1
