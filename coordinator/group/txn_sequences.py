"""The sequence numbers we write a client producer's transactional batches with, on one state partition.

The client's producer never writes our partition, so its sequence there is ours to keep (the partition leader
checks it: ProducerAppendInfo.checkSequence). Per producer id: the epoch and the next sequence. A new epoch (the
first batch, a bumped or a TV2 per-transaction epoch) starts at 0; sequences count records, so an acknowledged
batch advances by its record count (a batch's last sequence is its base + records - 1); one batch in flight per
producer id. A batch refused by the broker does not advance the sequence; a batch whose
outcome is unknown (a timeout, a lost connection) must be sent again as it is, with the same sequence, before
anything else of that producer: if it landed, the broker answers the duplicate with its original offset.

The log is the truth after a failover: whoever reads the partition reports each client batch (`observed_batch`)
and each marker (`observed_marker`), so a new owner continues where the log stands.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Outcome(Enum):
    ACKNOWLEDGED = "acknowledged"
    REFUSED = "refused"  # the broker answered an error: nothing was appended
    UNKNOWN = "unknown"  # no answer: it may have been appended


@dataclass(slots=True)
class ProducerSequence:
    epoch: int
    next_sequence: int
    in_flight: int | None = None  # the sequence of the batch on its way
    in_flight_records: int = 0
    resend: int | None = None  # the sequence of a batch of unknown outcome, to be sent again as it was


class Busy(Exception):
    """A batch of this producer is in flight, or one of unknown outcome must be sent again first."""


class ProducerSequences:
    """One state partition's sequences of client producers (mutated on the shard's loop only)."""

    def __init__(self) -> None:
        self._producers: dict[int, ProducerSequence] = {}
        self.forgotten = 0  # how many times the partition left (`forget`): a claim across one is from another life

    def claim(self, producer_id: int, epoch: int, records: int) -> int:
        """The base sequence for the next batch of (producer_id, epoch) of `records` records; Busy while one is
        in flight or owed again."""
        state = self._producers.get(producer_id)
        if state is not None and (state.in_flight is not None or state.resend is not None):
            raise Busy(f"producer {producer_id}: batch {state.in_flight or state.resend} is unsettled")
        if state is not None and epoch < state.epoch:
            return 0  # the broker refuses a lower epoch (INVALID_PRODUCER_EPOCH): nothing recorded
        if state is None or epoch > state.epoch:
            state = self._producers[producer_id] = ProducerSequence(epoch, 0)
        state.in_flight, state.in_flight_records = state.next_sequence, records
        return state.next_sequence

    def claim_resend(self, producer_id: int) -> int | None:
        """The sequence of the batch owed again (now in flight again), or None if none is owed."""
        state = self._producers.get(producer_id)
        if state is None or state.resend is None:
            return None
        state.in_flight, state.resend = state.resend, None
        return state.in_flight

    def settle(self, producer_id: int, epoch: int, sequence: int, outcome: Outcome) -> None:
        state = self._producers.get(producer_id)
        if state is None or state.epoch != epoch or state.in_flight != sequence:
            return  # a batch of a lower epoch (not recorded), or the log moved on meanwhile
        state.in_flight = None
        if outcome is Outcome.ACKNOWLEDGED:
            # never behind what the log showed meanwhile (a load or the tail read a later batch of the producer)
            state.next_sequence = max(state.next_sequence, sequence + state.in_flight_records)
        elif outcome is Outcome.UNKNOWN:
            state.resend = sequence

    def observed_batch(self, producer_id: int, epoch: int, last_sequence: int) -> None:
        """A batch of the producer read from the log (the load, the tail): the log's sequence wins."""
        state = self._producers.get(producer_id)
        if state is None or epoch > state.epoch:
            self._producers[producer_id] = ProducerSequence(epoch, last_sequence + 1)
        elif epoch == state.epoch and last_sequence + 1 > state.next_sequence:
            state.next_sequence = last_sequence + 1
            if state.resend is not None and state.resend <= last_sequence:
                state.resend = None  # the batch of unknown outcome is in the log

    def observed_marker(self, producer_id: int, epoch: int) -> None:
        """A marker of the producer: a marker of a higher epoch (TV2's bump, a fence) starts the sequence again."""
        state = self._producers.get(producer_id)
        if state is not None and epoch > state.epoch and state.in_flight is None:
            self._producers[producer_id] = ProducerSequence(epoch, 0)

    def next_sequence(self, producer_id: int, epoch: int) -> int:
        state = self._producers.get(producer_id)
        return 0 if state is None or state.epoch != epoch else state.next_sequence

    def forget(self) -> None:
        """The partition left this coordinator: the next owner reads the log."""
        self._producers.clear()
        self.forgotten += 1
