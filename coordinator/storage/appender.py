"""The append path of the Kafka-backed store: a shard's typed records encoded in Kafka's formats and queued with
the partition's writer at once (so a partition's records are stored in the order appended), answered once
acknowledged. A write of tombstones only goes through the tombstone writer, which keeps a failed one owed and
sends it again (tombstones.py); a write of values supersedes the owed tombstones of its keys, restored if it
and every later write of those keys issued meanwhile fail."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from confluent_kafka import KafkaError

from coordinator.group.records import OffsetCommitRecord, Record
from coordinator.group.store import StoreError
from coordinator.storage.append_errors import append_error
from coordinator.storage.outcome import Outcome, when_settled
from coordinator.storage.producer import KafkaRecord, RecordSender
from coordinator.storage.records import encode
from coordinator.storage.tombstones import TombstoneWriter
from protocol.error_codes import Errors

log = logging.getLogger("coordinator.storage")
_BATCH_OVERHEAD_BYTES = 61  # record batch header (magic v2)
_RECORD_OVERHEAD_BYTES = 21  # a record's length, attributes, deltas, key/value lengths and headers (varints, at most)


class RecordAppender:
    def __init__(self, tombstones: TombstoneWriter, max_write_bytes: int) -> None:
        self._tombstones = tombstones
        self._max_write_bytes = max_write_bytes

    def append(self, producer: RecordSender, partition: int, records: Sequence[Record],
               outcome: asyncio.Future[None], *, offsets: list[int] | None = None) -> None:
        """Queue `records` with `producer` now; `outcome` is settled with None or StoreError (in the call that
        settles the producer's future, if that is an Outcome: no loop turn between the two). Raises StoreError
        for a write refused before anything is sent. Once acknowledged, each offset commit record's value
        carries its record's offset in `log_offset` (which orders it against a client's transactional commit),
        and `offsets` gets every record's offset, in the records' order."""
        group_id = records[0].group_id if records else ""
        encoded: list[KafkaRecord] = [(partition, *encode(record)) for record in records]
        if any(value is not None for _, _, value in encoded):
            self._append(producer, group_id, encoded, outcome, records, offsets)
        else:
            self._append_tombstones(producer, group_id, encoded, outcome)

    def _append(self, producer: RecordSender, group_id: str, records: list[KafkaRecord],
                outcome: asyncio.Future[None], typed: Sequence[Record], offsets: list[int] | None) -> None:
        self._check_write_size(group_id, records)
        superseded = self._tombstones.superseded(key for _, key, _ in records)
        reported: list[int] = []

        def sent(done: asyncio.Future[KafkaError | None]) -> None:
            error = done.result()
            if error is None:
                if superseded:
                    self._tombstones.written(superseded)
                _report_offsets(typed, reported, offsets)
                _settle(outcome, None)
                return
            if superseded:
                self._tombstones.restore(superseded)
            mapped = append_error(error)
            log.warning("event=state_append_failed group=%s records=%d error=%s kafka_error=%s",
                        group_id, len(records), mapped.name, error)
            _settle(outcome, StoreError(mapped, str(error)))

        when_settled(producer.send(records, offsets=reported), sent)  # the outcome in the producer's settling call

    def append_together(self, producer: RecordSender, partition: int, writes: Sequence[Sequence[Record]]
                        ) -> list[asyncio.Future[None]]:
        """Several writes queued in order, consecutive ones sent as one (one transaction of the producer's, one
        outcome) up to max_write_bytes together; a write of tombstones only goes through the tombstone writer on
        its own, as `append` sends it, and a write too large alone is refused alone. One future per write (the
        same one for writes sent together)."""
        loop = asyncio.get_running_loop()
        outcomes: list[asyncio.Future[None]] = []
        typed: list[Record] = []
        encoded: list[KafkaRecord] = []
        shared: asyncio.Future[None] | None = None
        size = _BATCH_OVERHEAD_BYTES

        def send_shared() -> None:
            nonlocal typed, encoded, shared, size
            if shared is not None:
                self._append(producer, typed[0].group_id, encoded, shared, typed, None)
            typed, encoded, shared, size = [], [], None, _BATCH_OVERHEAD_BYTES

        for records in writes:
            group_id = records[0].group_id if records else ""
            one: list[KafkaRecord] = [(partition, *encode(record)) for record in records]
            one_size = _records_size(one)
            outcome: asyncio.Future[None] = Outcome(loop=loop)
            if not any(value is not None for _, _, value in one):
                send_shared()
                self._append_tombstones(producer, group_id, one, outcome)
            elif one_size + _BATCH_OVERHEAD_BYTES > self._max_write_bytes:
                send_shared()
                try:
                    self._check_write_size(group_id, one)
                except StoreError as exc:  # without the traceback: it names this frame, which holds `outcome`
                    outcome.set_exception(exc.with_traceback(None))
            else:
                if size + one_size > self._max_write_bytes:
                    send_shared()
                if shared is None:
                    shared = Outcome(loop=loop)
                outcome = shared
                typed.extend(records)
                encoded.extend(one)
                size += one_size
            outcomes.append(outcome)
        send_shared()
        return outcomes

    def _check_write_size(self, group_id: str, records: list[KafkaRecord]) -> None:
        """Kafka appends a write as one record batch, so it is stored whole or not at all, and a batch above
        max.message.bytes fails with MESSAGE_TOO_LARGE. librdkafka would spread a bigger write over several
        produce requests, each acknowledged on its own: refuse it before anything is sent."""
        size = _BATCH_OVERHEAD_BYTES + _records_size(records)
        if size > self._max_write_bytes:
            log.warning("event=state_append_refused group=%s records=%d bytes=%d max_write_bytes=%d",
                        group_id, len(records), size, self._max_write_bytes)
            raise StoreError(Errors.MESSAGE_TOO_LARGE,
                             f"write of {size} bytes exceeds max_write_bytes={self._max_write_bytes}")

    def _append_tombstones(self, producer: RecordSender, group_id: str, records: list[KafkaRecord],
                           outcome: asyncio.Future[None]) -> None:
        """Answered like any write, but a failed tombstone is not forgotten: it is sent again until written
        (see tombstones.py), so a deleted group does not come back after a restart."""
        if not records:
            outcome.set_result(None)
            return

        def sent(done: asyncio.Future[KafkaError | None]) -> None:
            error = done.result()
            _settle(outcome, None if error is None else StoreError(append_error(error), str(error)))

        self._tombstones.send(producer, group_id, [(partition, key) for partition, key, _ in records],
                              "tombstones").add_done_callback(sent)


def _records_size(records: Sequence[KafkaRecord]) -> int:
    return sum(len(key) + len(value or b"") + _RECORD_OVERHEAD_BYTES for _, key, value in records)


def _report_offsets(records: Sequence[Record], reported: list[int], offsets: list[int] | None) -> None:
    """A write is records of one partition (one group's, or several writes sent together), produced in order:
    its records' offsets are the delivery reports' offsets in ascending order. Left unset if a report is
    missing."""
    if len(reported) != len(records):
        return
    ordered = sorted(reported)
    for record, offset in zip(records, ordered):
        if isinstance(record, OffsetCommitRecord) and record.value is not None:
            record.value.log_offset = offset
    if offsets is not None:
        offsets.extend(ordered)


def _settle(outcome: asyncio.Future[None], error: StoreError | None) -> None:
    if outcome.done():
        return
    if error is None:
        outcome.set_result(None)
    else:
        outcome.set_exception(error)
