"""The Kafka-backed `GroupStore`: group records and offsets in a compacted topic, Kafka's formats (§7.3, §7.4).

Lifecycle: `await start()` (create or verify the state topic, start the producers), `await load(partitions)`
(replay partitions of the state topic; the runtime materialises their groups before it serves them), `append`
while serving, `await unload(partitions)` when giving partitions up, and `await close()`.

`append(partition, records)` encodes the shard's typed records and queues them with the partition's producer
before it returns (appender.py; one FIFO per partition: partition_writers.py, producer.py), so a partition's records are
stored in the order they were appended; the future it returns resolves once they are acknowledged by every
in-sync replica (acks=all) and raises `StoreError(<raw Kafka error>)` otherwise; the runtime hands the raw
error to the write's owner, which maps it per API (coordinator/group/errors.py). A write of tombstones only
(deleted groups, expired or deleted offsets) is answered the same way; one that fails stays owed and is sent
again (tombstones.py).

The writer is chosen by the config (state_producers.py). With `StorageConfig.partition_fencing` (several
instances sharing the state topic) every owned partition has a transactional producer of its own (`transactional.id = <transactional_id>-p<partition>`, partition_writers.py
`PartitionTransactions`): `load` creates and initialises them before it takes the end offsets (reading
meanwhile), which fences the partitions' previous owner and aborts the transaction it left open; `unload`
closes them once their writes in flight are done; an append to a partition not loaded fails NOT_COORDINATOR,
and `on_fenced(partition)` tells the owner of the store (on the loop, once) when a newer owner fenced a
partition's producer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Collection, Sequence
from typing import Callable, Iterable

from protocol.error_codes import Errors
from coordinator.group.partitioner import partition_for
from coordinator.group.records import (GroupMetadataRecord, GroupRecord, OffsetCommitRecord, OffsetRecord, Record,
                                       TopicPartition, offset_commits, tombstones)
from coordinator.group.modern.records import RecordType, Tombstone
from coordinator.group.store import GroupStore, LoadedGroups, StoreError
from coordinator.group.txn_offsets import TransactionEvent, nothing_to_restore
from coordinator.security.clusters import cluster_security
from coordinator.storage.appender import RecordAppender
from coordinator.storage.config import StorageConfig
from coordinator.storage.loader import consumer_settings, read_state_with_transactions
from coordinator.storage.partition_writers import PartitionTransactions
from coordinator.storage.consumer_records import CONSUMER_GROUP_TYPES
from coordinator.storage.consumer_records import decode as decode_consumer_record
from coordinator.storage.records import (OPEN_AHEAD_KEY, GroupMetadataKey, OffsetCommitKey, UnknownKey, decode_key,
                                         encode)
from coordinator.storage.state_producers import StateProducer, open_state_producer
from coordinator.storage.outcome import Outcome
from coordinator.storage.tombstones import TombstoneWriter
from coordinator.storage.topics import ensure_state_topic, make_admin
from coordinator.storage.txn_tail import TransactionTails, client_batch
from coordinator.storage.uncommitted_load import UncommittedLoad, reads_raw
from coordinator.timer.clock import Clock, MonotonicClock

log = logging.getLogger("coordinator.storage")


class KafkaGroupStore(GroupStore):
    def __init__(self, config: StorageConfig, clock: Clock | None = None, load_timeout_ms: int = 300_000,
                 load_buffer_bytes: int = 5_242_880) -> None:
        self.config = config
        self.partitions = config.partitions
        self.topic = config.state_topic
        self.clock = clock or MonotonicClock()
        self.load_timeout_ms = load_timeout_ms
        self.load_buffer_bytes = load_buffer_bytes
        self._producer: StateProducer | None = None
        self._fencing: PartitionTransactions | None = None  # with partition_fencing: one producer per partition
        # with partition_fencing: called on the loop, once per partition, when another instance fenced its producer
        self.on_fenced: Callable[[int], None] | None = None
        self._stop_loading = threading.Event()
        self._tombstones = TombstoneWriter(config.tombstone_retry_ms / 1000, on_landed=self._tombstones_landed)
        # partition → who is told where our offset tombstones landed in it (follow_tombstones)
        self._tombstone_followers: dict[int, Callable[[str, TopicPartition, int | None], None]] = {}
        self._appender = RecordAppender(self._tombstones, config.max_write_bytes)
        self._unloaded: set[int] = set()  # partitions given up: appends to them fail NOT_COORDINATOR
        self._load_pending: dict[int, set[int]] = {}  # partition → producer ids its last load left pending
        self._tails: TransactionTails | None = None  # the served partitions' markers (None: a cluster only librdkafka reaches)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Create or verify the state topic (TopicMismatchError if unusable) and the event topic; start writing."""
        admin = make_admin(self.config)
        try:
            await ensure_state_topic(admin, self.config)
        finally:
            admin.release()
        self._producer = await open_state_producer(self.config, self._partition_fenced)
        if isinstance(self._producer, PartitionTransactions):
            self._fencing = self._producer
        security = cluster_security(self.config.bootstrap)
        if reads_raw(security):
            self._tails = TransactionTails(self.config.bootstrap, security, self.config.state_topic, self._is_ours,
                                           max_bytes=self.load_buffer_bytes)
        log.info("event=store_started topic=%s partitions=%d bootstrap=%s transactional_id=%s "
                 "partition_fencing=%s", self.config.state_topic, self.config.partitions, self.config.bootstrap,
                 self.config.transactional_id, self.config.partition_fencing)

    async def read(self, partitions: Iterable[int] | None = None, stop: threading.Event | None = None,
                   ends_after: threading.Event | None = None) -> LoadedGroups:
        """Replay the state topic (all partitions by default) from the earliest offset to the end offset: the
        latest records as the codec decodes them. `stop` (default: the store's) ends it with LoadError; with
        `ends_after` the end offsets are taken once that event is set (loader.read_state_with_transactions)."""
        wanted = sorted(range(self.config.partitions) if partitions is None else partitions)
        settings = consumer_settings(self.config.bootstrap, self.config.client_id, self.load_buffer_bytes)
        started_ms = self.clock.now_ms()
        state, transactions = await asyncio.to_thread(
            read_state_with_transactions, settings, self.config.state_topic, wanted, self.clock,
            self.load_timeout_ms, stop or self._stop_loading, ends_after,
            own_transactional_id_prefix=self.config.transactional_id)
        self._take_transactions(state, transactions)
        log.info("event=state_loaded topic=%s partitions=%d groups=%d offset_groups=%d records=%d unknown=%d "
                 "malformed=%d duration_ms=%d", self.config.state_topic, len(wanted), len(state.groups),
                 len(state.offsets), state.records, state.unknown_records, state.malformed_records,
                 self.clock.now_ms() - started_ms)
        return state

    def _take_transactions(self, state: LoadedGroups, transactions: UncommittedLoad | None) -> None:
        """The clients' open transactions and the read's end positions, into the loaded state."""
        if transactions is None:
            log.info("event=state_loaded_read_committed topic=%s detail=a SASL mechanism only librdkafka "
                     "speaks (OAUTHBEARER through OIDC): client transactions are read as committed only, and none is followed while served",
                     self.config.state_topic)
            return
        for partition in transactions.pending.keys() | transactions.settled.keys():
            # the settled producers' last batches carry no offsets, only where their sequences stand
            batches = [*transactions.settled.get(partition, ()),
                       *(batch for txn in transactions.pending.get(partition, ()) for batch in txn.batches)]
            state.open_transactions[partition] = [client_batch(batch)
                                                  for batch in sorted(batches, key=lambda b: b.base_offset)]
        for partition in transactions.positions:
            self._load_pending[partition] = {txn.producer_id for txn in transactions.pending.get(partition, ())}
        for partition, pending in transactions.pending.items():
            log.info("event=state_pending_client_transactions topic=%s partition=%d producers=%s",
                     self.config.state_topic, partition, sorted(txn.producer_id for txn in pending))
        state.read_to.update(transactions.positions)

    def _is_ours(self, transactional_id: str) -> bool:
        prefix = self.config.transactional_id
        return prefix is not None and transactional_id.startswith(prefix)

    def follow_transactions(self, partition: int, start: int,
                            deliver: Callable[[list[TransactionEvent], int], None]) -> None:
        if self._tails is not None and partition not in self._unloaded:
            self._tails.follow(partition, start, deliver, self._load_pending.pop(partition, ()))

    def follow_tombstones(self, partition: int, landed: Callable[[str, TopicPartition, int | None], None]) -> None:
        if partition not in self._unloaded:
            self._tombstone_followers[partition] = landed

    def tombstone_in_flight(self, group_id: str, tp: TopicPartition) -> bool:
        return self._tombstones.in_flight(_offset_key(group_id, tp))

    def tombstones_answered(self, group_id: str, partitions: Collection[TopicPartition]
                            ) -> asyncio.Future[None] | None:
        return self._tombstones.answered(_offset_key(group_id, tp) for tp in partitions)

    def unwritten_tombstones_of(self, group_id: str) -> set[TopicPartition]:
        return {(key.topic, key.partition) for raw in self._tombstones.unwritten_of(group_id)
                if isinstance(key := decode_key(raw), OffsetCommitKey)}

    def unwritten_group_tombstones_of(self, group_id: str) -> list[Record]:
        records = (_group_tombstone(group_id, raw) for raw in self._tombstones.unwritten_of(group_id))
        return [record for record in records if record is not None]

    def _tombstones_landed(self, partition: int, landed: list[tuple[bytes, int | None]]) -> None:
        follower = self._tombstone_followers.get(partition)
        if follower is None:
            return
        for key, log_offset in landed:
            decoded = decode_key(key)
            if isinstance(decoded, OffsetCommitKey):
                follower(decoded.group, (decoded.topic, decoded.partition), log_offset)

    def supersede_tombstones(self, partition: int, group_id: str, partitions: Collection[TopicPartition]
                             ) -> Callable[[], None]:
        """A client's batch supersedes the owed tombstones of its offsets as our own later commit would: Kafka
        does not send a failed tombstone again (its timeline reverts the deletion), so a commit after the failed
        deletion stays. Restored only while the partition is still ours."""
        superseded = self._tombstones.superseded(_offset_key(group_id, tp) for tp in partitions)
        if not superseded:
            return nothing_to_restore

        def restore() -> None:
            if partition not in self._unloaded:
                self._tombstones.restore(superseded)

        return restore

    async def load(self, partitions: Collection[int]) -> LoadedGroups:
        """§7.4: read the partitions to their end (in a worker thread, decoding included, so the loop keeps
        serving the other partitions) and take them back for writing. With partition fencing, fence them too
        (their producers, created in parallel): the previous owner's open transaction is aborted before the end
        offsets are taken, so the read sees everything it committed and nothing it can still write.

        If fencing or reading fails (KafkaException / LoadError: broker unreachable past the load timeout, store
        closing) the error propagates: serving an empty state would look like every group was lost."""
        if self._fencing is None:
            state = await self.read(partitions)
        else:
            state = await self._fence_and_read(self._fencing, partitions)
        self._unloaded.difference_update(partitions)
        return state

    async def _fence_and_read(self, fencing: PartitionTransactions, partitions: Collection[int]) -> LoadedGroups:
        """Fence, and read meanwhile: the end offsets are taken only once every partition is fenced (so the
        read covers all the previous owner committed and nothing it can still write), but the records below
        them are read while the producers initialise."""
        fenced = threading.Event()
        stop = _EitherEvent(self._stop_loading)
        reading = asyncio.ensure_future(self.read(partitions, stop, fenced))
        started_ms = self.clock.now_ms()
        try:
            await fencing.acquire(partitions, self.load_timeout_ms)
        except BaseException:
            stop.set()
            await asyncio.gather(reading, return_exceptions=True)
            raise
        log.info("event=partitions_fenced topic=%s partitions=%d duration_ms=%d", self.config.state_topic,
                 len(partitions), self.clock.now_ms() - started_ms)
        fenced.set()
        try:
            return await reading
        except BaseException:  # cancelled (the load was stopped): the reading thread ends too
            stop.set()
            raise

    async def unload(self, partitions: Collection[int]) -> None:
        """Stop writing the partitions: new appends fail NOT_COORDINATOR at once, owed tombstones of them are
        dropped (their new owner has the say), and with partition fencing their producers close once the writes
        in flight are done (bounded by the commit timeout)."""
        self._unloaded.update(partitions)
        if self._tails is not None:
            self._tails.stop(partitions)
        self._tombstones.forget(partitions)
        for partition in partitions:
            self._tombstone_followers.pop(partition, None)
        if self._fencing is not None:
            await self._fencing.release(partitions, self.config.commit_timeout_ms)
        log.info("event=partitions_unloaded topic=%s partitions=%s", self.config.state_topic, sorted(partitions))

    def _partition_fenced(self, partition: int) -> None:
        # INFO: the owner of the store logs the one WARNING for it, with what it does next (cluster/ownership.py)
        log.info("event=partition_fenced topic=%s partition=%d reason=another_instance_owns_it",
                  self.config.state_topic, partition)
        self._unloaded.add(partition)
        if self._tails is not None:
            self._tails.stop([partition])
        self._tombstones.forget([partition])  # the new owner's to write now
        self._tombstone_followers.pop(partition, None)
        if self.on_fenced is not None:
            self.on_fenced(partition)

    @property
    def unwritten_tombstones(self) -> int:
        """Tombstones not yet acknowledged by Kafka (in flight or owed a retry)."""
        return self._tombstones.unwritten

    async def flush(self) -> None:
        """Wait until every record appended so far (tombstones included) is acknowledged or failed."""
        if self._producer is not None:
            await self._producer.flush(self.config.commit_timeout_ms)

    async def close(self) -> None:
        self._stop_loading.set()
        self._tombstones.stop_retrying()
        if self._tails is not None:
            await self._tails.close()
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.close()
        self._tombstones.report_unwritten()

    # -- GroupStore ----------------------------------------------------------------------------------------------
    def append(self, partition: int, records: Sequence[Record], *, offsets: list[int] | None = None
               ) -> asyncio.Future[None]:
        """Queues the records with the partition's producer before it returns (see GroupStore.append). A write
        of tombstones only goes through the tombstone writer (kept owed and sent again if it fails). Once
        acknowledged, an offset commit record's value carries its record's offset (`log_offset`) and `offsets`
        gets the records' offsets in order (from librdkafka's delivery reports)."""
        outcome: asyncio.Future[None] = Outcome(loop=asyncio.get_running_loop())
        try:
            if self._producer is None:
                raise StoreError(Errors.COORDINATOR_NOT_AVAILABLE, "store not started or closed")
            if partition in self._unloaded or (self._fencing is not None and not self._fencing.owns(partition)):
                raise StoreError(Errors.NOT_COORDINATOR, f"partition {partition} is not loaded here")
            self._appender.append(self._producer, partition, records, outcome, offsets=offsets)
        except StoreError as exc:  # without the traceback: it names this frame, which holds `outcome`
            outcome.set_exception(exc.with_traceback(None))
        return outcome

    def append_together(self, partition: int, writes: Sequence[Sequence[Record]]
                        ) -> Sequence[asyncio.Future[None]]:
        """Several writes queued in order before it returns, consecutive ones sent as one (appender.py: one
        transaction, one outcome, up to max_write_bytes together); see GroupStore.append_together."""
        try:
            if self._producer is None:
                raise StoreError(Errors.COORDINATOR_NOT_AVAILABLE, "store not started or closed")
            if partition in self._unloaded or (self._fencing is not None and not self._fencing.owns(partition)):
                raise StoreError(Errors.NOT_COORDINATOR, f"partition {partition} is not loaded here")
        except StoreError as exc:
            refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            refused.set_exception(exc.with_traceback(None))  # its traceback would name this frame: a cycle
            refused.exception()  # retrieved here: each write's owner hears of it through its own awaitable
            return [refused] * len(writes)
        return self._appender.append_together(self._producer, partition, writes)

    def expect_append(self, partition: int) -> None:
        """The partition's writer prepares for a write that comes soon (`open_ahead`): a transactional one opens
        the partition's transaction now (transactions.py), so the write waits for two round trips to Kafka, not
        three; the idempotent one has nothing to prepare."""
        if self._producer is not None and partition not in self._unloaded:
            self._producer.open_ahead(partition, (partition, OPEN_AHEAD_KEY, None))

    # -- helpers for tools and tests that hold no runtime (the store places the group with Kafka's partitioner) --
    async def store_group(self, group_id: str, record: GroupRecord) -> None:
        await self.append(self._partition(group_id), [GroupMetadataRecord(group_id, record)])

    async def store_offsets(self, group_id: str, offsets: dict[TopicPartition, OffsetRecord]) -> None:
        await self.append(self._partition(group_id), offset_commits(group_id, offsets))

    async def delete_group(self, group_id: str, offsets_to_tombstone: list[TopicPartition],
                           write_group_tombstone: bool) -> None:
        """Returns after the first attempt and never raises (a failed tombstone stays owed)."""
        await self._tombstone_quietly(group_id, tombstones(group_id, offsets_to_tombstone, write_group_tombstone))

    async def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> None:
        await self._tombstone_quietly(group_id, tombstones(group_id, partitions, False))

    async def _tombstone_quietly(self, group_id: str, records: list[Record]) -> None:
        try:
            await self.append(self._partition(group_id), records)
        except StoreError as exc:  # owed: sent again until written (already logged by the tombstone writer)
            log.debug("event=tombstones_owed group=%s error=%s", group_id, exc.error.name)
            exc.__traceback__ = None  # it names this frame, whose awaited future holds it

    # -- internals -----------------------------------------------------------------------------------------------
    def _partition(self, group_id: str) -> int:
        return partition_for(group_id, self.config.partitions)

    def retry_owed_tombstones(self) -> None:
        """Queue the owed tombstones again now (the retrier does it with back-off)."""
        self._tombstones.retry_owed()


def _offset_key(group_id: str, tp: TopicPartition) -> bytes:
    return encode(OffsetCommitRecord(group_id, tp[0], tp[1], None))[0]


def _group_tombstone(group_id: str, raw: bytes) -> Record | None:
    """The typed tombstone of one of the group's keys if it is a group-level one (a classic group's metadata, a
    consumer group's records); None for an offset's."""
    key = decode_key(raw)
    if isinstance(key, GroupMetadataKey):
        return GroupMetadataRecord(key.group, None)
    if not isinstance(key, UnknownKey) or key.version not in CONSUMER_GROUP_TYPES:
        return None
    if key.version == RecordType.PARTITION_METADATA:  # Kafka 4.0's, which decode() does not hand back
        return Tombstone(RecordType.PARTITION_METADATA, group_id)
    return decode_consumer_record(raw, None)


class _EitherEvent(threading.Event):
    """Set on its own, or when the store's own stop event is."""

    def __init__(self, other: threading.Event) -> None:
        super().__init__()
        self._other = other

    def is_set(self) -> bool:
        return super().is_set() or self._other.is_set()


def loaded_group_records(state: LoadedGroups) -> dict[str, GroupRecord]:
    return dict(state.groups)


def loaded_offset_records(state: LoadedGroups) -> dict[str, dict[TopicPartition, OffsetRecord]]:
    return {group_id: dict(offsets) for group_id, offsets in state.offsets.items()}
