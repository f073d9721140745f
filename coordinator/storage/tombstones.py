"""Tombstones that must reach the state topic even though nobody waits for them.

Kafka appends DeleteGroups and offset-expiry tombstones without waiting (acks=0), but its append is to the
local log of the partition it leads, so it does not fail for an unreachable cluster. Ours goes over the network:
a tombstone lost while Kafka is unreachable would let a restarted coordinator load the deleted group and its
offsets again. So a failed tombstone is kept and sent again, with back-off, until it is written — unless a newer
write of the same key was issued meanwhile (then the tombstone must not land after it). A newer write that
fails puts the tombstone back: the cache does not hold that value either, so "deleted" is still the truth.
What is still unwritten when the store closes is logged. Where each one landed (its delivery report's offset,
retries included; None for an attempt that failed, or an owed one superseded) goes to
`on_landed(partition, [(key, offset)])`, and `in_flight(key)` says whether one is unanswered or owed: a client's transactional batch is ordered against our
tombstones by log offset (coordinator/group/txn_offsets.py). A client's batch goes out through another connection,
so it waits until no attempt of its keys is unanswered (`answered`), then supersedes the owed ones: as in Kafka,
a tombstone handled before the batch lands before it, and one that failed never lands after it.

A tombstone a newer write superseded is held by it, and by every later write of its key issued while it is held:
it is owed again only when all of them failed (then none of their values is in the log, as far as we know, and
the deletion is still the truth). One of them acknowledged, it is gone: a later write's failure must not bring it
back, nor may an older write's failure while a newer one is in flight (the tombstone would land after that newer
value and delete what memory and the acknowledged log hold).

Order: a tombstone, its retries and every other write of its partition are queued with the producer at the
moment they are issued (`RecordSender.send` queues synchronously, in order per partition), so a retry queued
before a newer write of its key is stored before it, and a newer write queued first supersedes the retry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaError

from coordinator.rewrite_backoff import FIRST_RETRY_MS, MAX_RETRY_MS, next_retry_ms
from coordinator.storage.producer import KafkaRecord, RecordSender

log = logging.getLogger("coordinator.storage")

# (partition, [(key, log offset, or None: this attempt failed)]), on the loop
Landed = Callable[[int, list[tuple[bytes, int | None]]], None]


class _Tombstone:
    __slots__ = ("partition", "group_id", "in_flight")

    def __init__(self, partition: int, group_id: str) -> None:
        self.partition = partition
        self.group_id = group_id
        self.in_flight = True


class _Hold:
    """A tombstone superseded by writes of its key: `pending` of them unanswered, `written` once one is acked."""

    __slots__ = ("entry", "pending", "written")

    def __init__(self, entry: _Tombstone) -> None:
        self.entry = entry
        self.pending = 1
        self.written = False


class TombstoneWriter:
    def __init__(self, first_retry_s: float = FIRST_RETRY_MS / 1000, *, on_landed: Landed | None = None) -> None:
        self._first_retry_ms = max(round(first_retry_s * 1000), 1)
        self._on_landed = on_landed
        self._unwritten: dict[bytes, _Tombstone] = {}  # key → its latest tombstone not yet acknowledged
        self._sending: dict[bytes, int] = {}  # key → attempts not answered yet (superseded ones too)
        self._holds: dict[bytes, _Hold] = {}  # key → its tombstone superseded by writes not all answered
        self._answer_waiters: list[tuple[set[bytes], asyncio.Future[None]]] = []  # (keys, resolved once none sent)
        self._retrier: asyncio.Task[None] | None = None
        self._producer: RecordSender | None = None
        self._closed = False

    @property
    def unwritten(self) -> int:
        return len(self._unwritten)

    def in_flight(self, key: bytes) -> bool:
        """Whether a tombstone of `key` was sent and not answered yet, or is owed (its retry lands later): where
        the latest lands is not known yet."""
        return key in self._sending or key in self._unwritten

    def unwritten_of(self, group_id: str) -> list[bytes]:
        """The keys of the group whose latest tombstone is not acknowledged yet (sent and unanswered, or owed) and
        not superseded by a newer write: deleted in memory, maybe not in the log."""
        return [key for key, entry in self._unwritten.items() if entry.group_id == group_id]

    def answered(self, keys: Iterable[bytes]) -> asyncio.Future[None] | None:
        """None if no attempt of a tombstone of these keys is unanswered, else a future resolved once none is."""
        sent = {key for key in keys if key in self._sending}
        if not sent:
            return None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._answer_waiters.append((sent, waiter))
        return waiter

    def send(self, producer: RecordSender, group_id: str, keys: list[tuple[int, bytes]], what: str
             ) -> asyncio.Future[KafkaError | None]:
        """Append tombstones for `(partition, key)` now; keep sending failed ones until written or superseded.
        The future resolves with the first attempt's outcome (None: written)."""
        if not self._closed:
            self._producer = producer
        batch = []
        for partition, key in keys:
            entry = self._unwritten[key] = _Tombstone(partition, group_id)
            self._holds.pop(key, None)  # a newer deletion: what older writes superseded is never owed again
            batch.append((key, entry))
        first: asyncio.Future[KafkaError | None] = asyncio.get_running_loop().create_future()
        self._send(producer, batch, what, first)
        return first

    def superseded(self, keys: Iterable[bytes]) -> dict[bytes, object]:
        """A newer write of these keys is being issued: their tombstones must not be sent again (owed ones, and
        those an earlier write in flight holds: this one holds them too). Returns what `restore` needs if that
        write fails, `written` if it is acknowledged."""
        if not self._unwritten and not self._holds:
            return {}
        superseded: dict[bytes, object] = {}
        for key in keys:
            entry = self._unwritten.pop(key, None)
            if entry is not None:
                superseded[key] = self._holds[key] = _Hold(entry)
                if self._on_landed is not None:  # not sent again: where it lands is known no better
                    self._on_landed(entry.partition, [(key, None)])
            elif (hold := self._holds.get(key)) is not None:
                hold.pending += 1
                superseded[key] = hold
        return superseded

    def restore(self, superseded: dict[bytes, object]) -> None:
        """The newer write failed: the tombstones it superseded are owed again once every write holding them
        failed (unless newer tombstones exist)."""
        for key, hold in superseded.items():
            assert isinstance(hold, _Hold)
            hold.pending -= 1
            if hold.pending == 0 and self._holds.get(key) is hold:
                del self._holds[key]
                if not hold.written and key not in self._unwritten:
                    self._unwritten[key] = hold.entry
        self._ensure_retrier()

    def written(self, superseded: dict[bytes, object]) -> None:
        """The newer write was acknowledged: its value follows the deletion in the log, the tombstones it
        superseded are never owed again."""
        for key, hold in superseded.items():
            assert isinstance(hold, _Hold)
            hold.pending -= 1
            hold.written = True
            if hold.pending == 0 and self._holds.get(key) is hold:
                del self._holds[key]

    def stop_retrying(self) -> None:
        """At close, before the producer is flushed: one last attempt for what is owed, then no more retries
        (delivery reports still count)."""
        if self._retrier is not None:
            self._retrier.cancel()
        if self._producer is not None and not self._closed:
            self._send_owed(self._producer)
        self._closed = True
        self._producer = None

    def forget(self, partitions: Iterable[int]) -> None:
        """The partitions were given up: their owed tombstones are no longer ours to write (sent by a store that
        no longer owns the partition they would be a zombie's writes)."""
        gone = set(partitions)
        dropped = {key: entry for key, entry in self._unwritten.items() if entry.partition in gone}
        for key in dropped:
            del self._unwritten[key]
        for key in [key for key, hold in self._holds.items() if hold.entry.partition in gone]:
            del self._holds[key]
        if dropped:
            log.warning("event=tombstones_dropped reason=partition_unloaded records=%d groups=%s", len(dropped),
                        sorted({entry.group_id for entry in dropped.values()}))

    def report_unwritten(self) -> None:
        """At close, after the producer is flushed: what a restarted coordinator will still find."""
        if self._unwritten:
            groups = sorted({entry.group_id for entry in self._unwritten.values()})
            log.warning("event=tombstones_unwritten records=%d groups=%s", len(self._unwritten), groups)

    def _send(self, producer: RecordSender, batch: list[tuple[bytes, _Tombstone]], what: str,
              outcome: asyncio.Future[KafkaError | None] | None = None) -> None:
        """One partition's tombstones, in order (so the delivery reports' offsets, sorted, are theirs)."""
        records: list[KafkaRecord] = [(entry.partition, key, None) for key, entry in batch]
        reported: list[int] = []
        for key, _ in batch:
            self._sending[key] = self._sending.get(key, 0) + 1

        def done(error: KafkaError | None) -> None:
            for key, _ in batch:
                left = self._sending.pop(key) - 1
                if left:
                    self._sending[key] = left
            self._on_done(batch, what, error)
            if self._answer_waiters:
                self._wake_answer_waiters()
            if self._on_landed is not None and batch:
                offsets: list[int | None] = list(sorted(reported)) if error is None and len(reported) == len(batch) \
                    else [None] * len(batch)
                self._on_landed(batch[0][1].partition, [(key, offset) for (key, _), offset in zip(batch, offsets)])
            if outcome is not None and not outcome.done():
                outcome.set_result(error)

        producer.send(records, offsets=reported).add_done_callback(lambda sent: done(sent.result()))

    def _wake_answer_waiters(self) -> None:
        waiting = []
        for keys, waiter in self._answer_waiters:
            if waiter.done():
                continue
            if keys.isdisjoint(self._sending):
                waiter.set_result(None)
            else:
                waiting.append((keys, waiter))
        self._answer_waiters = waiting

    def _on_done(self, batch: list[tuple[bytes, _Tombstone]], what: str, error: KafkaError | None) -> None:
        for _, entry in batch:  # also those superseded meanwhile: restored after a failed newer write, they are owed
            entry.in_flight = False
        current = [(key, entry) for key, entry in batch if self._unwritten.get(key) is entry]
        if error is None:
            for key, _ in current:
                del self._unwritten[key]
        if error is not None and current:
            log.warning("event=tombstone_append_failed op=%s groups=%s records=%d error=%s will_retry=true", what,
                        sorted({entry.group_id for _, entry in current}), len(current), error)
            self._ensure_retrier()

    def _ensure_retrier(self) -> None:
        if self._unwritten and not self._closed and (self._retrier is None or self._retrier.done()):
            self._retrier = asyncio.get_running_loop().create_task(self._retry(), name="tombstone-retry")

    async def _retry(self) -> None:
        delay_ms = self._first_retry_ms  # rewrite_backoff.py: the consumer groups' repair writes wait the same
        while self._unwritten and self._producer is not None:
            await asyncio.sleep(delay_ms / 1000)
            self.retry_owed()
            delay_ms = next_retry_ms(delay_ms, MAX_RETRY_MS)

    def retry_owed(self) -> None:
        """Queue every owed tombstone not in flight now (the retrier's step, also callable at any time)."""
        if self._producer is not None and not self._closed:
            self._send_owed(self._producer)

    def _send_owed(self, producer: RecordSender) -> None:
        by_partition: dict[int, list[tuple[bytes, _Tombstone]]] = {}
        for key, entry in self._unwritten.items():
            if not entry.in_flight:
                entry.in_flight = True
                by_partition.setdefault(entry.partition, []).append((key, entry))
        for owed in by_partition.values():
            self._send(producer, owed, "retry")
