"""The live tail of the state partitions this instance serves: the clients' transactional batches and the
COMMIT/ABORT markers the transaction coordinator writes into them, read while the partition is served.

A client's TxnOffsetCommit lands in our partition as a transactional batch of its producer; the cluster's
transaction coordinator decides the outcome and writes the marker, not through us, so the only way to learn it
is to read the partition (Kafka's group coordinator learns it as the partition's leader). Each followed
partition is read from where its load ended, read_uncommitted with a byte bound (`max_bytes`), on a connection of
its own to the partition's leader (a broker answers one request per connection at a time: partitions sharing one
would wait out each other's polls). How long a fetch waits depends on what the last one found: after data, until
16 KiB are there or 250 ms passed (under load one fetch then carries many of our own batches: a fetch's cost is
mostly fixed); after nothing, until the first byte arrives or `idle_wait_ms` (30 s) passed. So an idle partition
costs one fetch per 30 s instead of four a second, and a marker or a client's batch written to it is answered at
once, whoever wrote it (the relay, a former owner's late append): the tail needs no word of what may come. The
request frame is encoded once per tail and patched per fetch (`FetchFrame`).

The tails run as tasks of one thread with its own event loop: parsing what they fetch (our own writes too) never
stalls the coordinator's loop. What concerns a shard (a client's batch, a marker) is handed to the shard's loop
(`deliver(events, read_to)` runs there) and the tail waits until it has run before fetching on, so at most one
fetch's worth per partition is in memory. Of our own producers' batches (the shard's own writes, applied when
acknowledged) only our offset tombstones are handed over, once the partition has a client's batch (`TailReader`):
where one landed orders it against the clients' batches, and its acknowledgement can be lost. A producer id is
named ours or a client's
once, by ListTransactions on every broker (its transactional id against our prefix; connections the tails
share), and remembered (bounded). A producer id no broker lists is not named yet: a broker shutting down has
already dropped the transactions of the partitions it resigned and still answers NONE, and one starting lists
nothing for partitions it has not begun to load. The tail asks again from the same position, and only a producer
id unlisted for `unlisted_grace_s` is taken as a client's (a client's batch read late, its transactional id
expired since; taking ours for a client's leaves its offsets pending until its marker, taking a client's for ours
would lose its commits).

Errors never end a tail: a leadership change or a lost connection → new metadata and the same position; the
position out of range (deleted below it, or a truncated log) → read again from the log start; anything else →
the same position after a pause. Each is one log line.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field as dataclass_field, replace

from kio.static.primitive import i32, i64

from coordinator.group.records import OffsetCommitRecord
from coordinator.group.txn_offsets import (ClientTransactionalBatch, EndTransactionMarker, OwnOffsetTombstone,
                                           TransactionEvent)
from coordinator.security.clusters import ClusterSecurity
from coordinator.storage.transaction_log import decode_offset_commit
from coordinator.storage.uncommitted_load import RETRIABLE_FETCH_ERRORS, PartitionLeaders, transaction_states
from protocol import apis
from protocol.errors import ProtocolError
from protocol.fetch_reader import (FetchedBatch, FetchedPartition, FetchError, FetchFrame, MarkerType, WantsRecords,
                                  tolerant_request)
from protocol.messages import build, item_class

log = logging.getLogger("coordinator.storage")

Deliver = Callable[[list[TransactionEvent], int], None]  # (events in log order, read to): run on the shard's loop

_LIST_OFFSETS = 2
_EARLIEST = -2
_OFFSET_OUT_OF_RANGE = 1
_RETRY_S = 0.5
_KNOWN_PRODUCERS = 10_000  # producer ids remembered as ours or a client's
# how long a producer id no broker lists is asked about again before it is taken as a client's: longer than a
# broker's restart or a transaction coordinator partition's move
_UNLISTED_GRACE_S = 120.0
# After a fetch that found data, the next is answered once this much is there or after the wait: under load one
# fetch carries many of our own batches (each fetch's cost is mostly fixed)
_MIN_BYTES = 16 * 1024
_MAX_WAIT_MS = 250
# After a fetch that found nothing, the next is answered at the first byte or after this wait: an idle partition
# costs one fetch per wait, and what is written to it is seen at once. Below the broker's idle-connection limit
# (connections.max.idle.ms, 10 min); a connection lost without a word is noticed after it plus 30 s.
_IDLE_WAIT_MS = 30_000


def transaction_events(batches: Iterable[FetchedBatch], is_ours: Callable[[int], bool]) -> list[TransactionEvent]:
    """What a shard needs of these batches read from a tail's start (`TailReader.events`)."""
    return TailReader().events(batches, is_ours)


class TailReader:
    """What one tail hands its shard of the batches it fetches, in log order: the clients' transactional data
    batches (their offset commit records), every COMMIT/ABORT marker of a client's, and, once a client's batch was
    read, our own offset tombstones. Kafka's replay drops a pending offset at a tombstone of its key later in the
    log, and memory cannot learn where ours landed from acknowledgements alone (one can be lost while the
    tombstone is in the log). A tombstone in a transactional batch of ours takes effect at our COMMIT marker and
    not at all after our ABORT, as the loader applies it. Our batches are read record by record only then: they
    are the bulk of the partition, and before any client's batch no pending offset can lie below a tombstone.

    `settling`: the producer ids whose open transactions the load left pending. Their batches and their marker are
    handed over as a client's whatever the tail names them: the load named a producer no broker listed a client's
    (it cannot wait), and one the tail names ours would otherwise leave those offsets pending for good."""

    def __init__(self, settling: Collection[int] = ()) -> None:
        self.reads_ours = False
        self._open_ours: dict[int, list[OwnOffsetTombstone]] = {}  # our producer id → tombstones before its marker
        self.settling = set(settling)

    def _named(self, is_ours: Callable[[int], bool]) -> Callable[[int], bool]:
        settling = self.settling
        if not settling:
            return is_ours
        return lambda producer_id: producer_id not in settling and is_ours(producer_id)

    def wants_records(self, is_ours: Callable[[int], bool]) -> WantsRecords:
        """The parse's choice for one fetch (called in log order): a client's batch always; ours once a client's
        batch was read, in this fetch too (a producer not named yet counts as a client's)."""
        client_read = self.reads_ours
        is_ours = self._named(is_ours)

        def wants(producer_id: int, transactional: bool) -> bool:
            nonlocal client_read
            if transactional and not is_ours(producer_id):
                client_read = True
            return client_read
        return wants

    def events(self, batches: Iterable[FetchedBatch], is_ours: Callable[[int], bool]) -> list[TransactionEvent]:
        events: list[TransactionEvent] = []
        is_ours = self._named(is_ours)
        for batch in batches:
            if batch.is_control:
                if batch.marker is None:
                    continue
                if not is_ours(batch.producer_id):
                    events.append(EndTransactionMarker(batch.producer_id, batch.producer_epoch,
                                                       batch.marker == MarkerType.COMMIT, batch.base_offset))
                    self.settling.discard(batch.producer_id)  # settled: from now on named as the tail names it
                elif (held := self._open_ours.pop(batch.producer_id, None)) and batch.marker == MarkerType.COMMIT:
                    events.extend(replace(tombstone, settled_at=batch.base_offset) for tombstone in held)
            elif batch.is_transactional and not is_ours(batch.producer_id):
                events.append(client_batch(batch))
                self.reads_ours = True
            elif self.reads_ours and (tombstones := own_offset_tombstones(batch)):
                if batch.is_transactional:
                    self._open_ours.setdefault(batch.producer_id, []).extend(tombstones)
                else:
                    events.extend(tombstones)
        return events


def own_offset_tombstones(batch: FetchedBatch) -> list[OwnOffsetTombstone]:
    found = []
    for record in batch.records:
        if record.value is None and (commit := decode_offset_commit(record)) is not None:
            key = commit.key
            found.append(OwnOffsetTombstone(key.group, (key.topic, key.partition), record.offset, record.offset))
    return found


def client_batch(batch: FetchedBatch) -> ClientTransactionalBatch:
    commits = []
    for record in batch.records:
        commit = decode_offset_commit(record)
        if commit is not None:
            commits.append((commit.offset, OffsetCommitRecord(commit.key.group, commit.key.topic,
                                                              commit.key.partition, commit.value)))
    return ClientTransactionalBatch(batch.producer_id, batch.producer_epoch,
                                    batch.base_sequence + batch.last_offset - batch.base_offset, batch.last_offset,
                                    tuple(commits))


class ProducerOwners:
    """Which producer ids are ours: asked until some broker lists them (at most `unlisted_grace_s`), remembered
    for the last `capacity` named."""

    def __init__(self, is_ours: Callable[[str], bool], capacity: int = _KNOWN_PRODUCERS,
                 unlisted_grace_s: float = _UNLISTED_GRACE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._is_ours = is_ours
        self._capacity = capacity
        self._grace_s = unlisted_grace_s
        self._clock = clock
        self._known: OrderedDict[int, bool] = OrderedDict()
        self._unlisted: OrderedDict[int, float] = OrderedDict()  # producer id → when no broker first listed it

    def unknown(self, batches: Iterable[FetchedBatch]) -> set[int]:
        return {b.producer_id for b in batches if b.is_transactional and b.producer_id not in self._known}

    def learn(self, producer_ids: Collection[int], states: dict[int, tuple[str, str]]) -> None:
        """`states`: ListTransactions' answer (producer id → transactional id, state), every broker asked. A
        producer id it does not list stays unknown until its grace has passed, then is a client's."""
        now = self._clock()
        for producer_id in producer_ids:
            listed = states.get(producer_id)
            if listed is None:
                first = self._unlisted.get(producer_id)
                if first is None:
                    first = self._unlisted[producer_id] = now
                    log.info("event=txn_producer_unlisted producer_id=%d grace_s=%.0f (no broker lists it: asked "
                             "again until it is listed, a broker restarting or a transaction coordinator "
                             "partition moving)", producer_id, self._grace_s)
                if now - first < self._grace_s:
                    continue
                log.warning("event=txn_producer_taken_as_client producer_id=%d unlisted_s=%.0f", producer_id,
                            now - first)
            self._unlisted.pop(producer_id, None)
            self._known[producer_id] = listed is not None and self._is_ours(listed[0])
            self._known.move_to_end(producer_id)
        for remembered in (self._known, self._unlisted):
            while len(remembered) > self._capacity:
                remembered.popitem(last=False)

    def is_ours(self, producer_id: int) -> bool:
        return self._known.get(producer_id, False)

    @property
    def ours(self) -> set[int]:
        return {producer_id for producer_id, ours in self._known.items() if ours}


class ProducersUnlisted(Exception):
    """A fetch's batches have producers no broker lists yet: read them again after a pause."""


class TransactionTails:
    """The tails of the partitions followed, in a thread of their own (started at the first `follow`)."""

    def __init__(self, bootstrap: str, security: ClusterSecurity | None, topic: str,
                 is_ours: Callable[[str], bool], *, max_bytes: int = 1 << 20, max_wait_ms: int = _MAX_WAIT_MS,
                 min_bytes: int = _MIN_BYTES, idle_wait_ms: int = _IDLE_WAIT_MS) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self.topic = topic
        self.max_bytes = max_bytes
        self.max_wait_ms = max_wait_ms
        self.min_bytes = min_bytes
        self.idle_wait_ms = idle_wait_ms
        self.fetches = 0  # Fetch requests sent by every tail so far (written on the tails' thread)
        self.owners = ProducerOwners(is_ours)  # used on the tails' thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: dict[int, asyncio.Task[None]] = {}  # the tails' thread only
        self._lookups: PartitionLeaders | None = None  # the tails' thread: connections for ListTransactions
        self._followed: dict[int, object] = {}  # partition → the token of its current tail (the caller's loop)

    @property
    def followed(self) -> set[int]:
        return set(self._followed)

    def follow(self, partition: int, start: int, deliver: Deliver, settling: Collection[int] = ()) -> None:
        """Read `partition` from `start` on, handing its events to `deliver` on the calling loop, until `stop`
        (a tail already following it is replaced). `settling`: the producer ids the load left pending
        (`TailReader`)."""
        caller = asyncio.get_running_loop()
        token = object()
        self._followed[partition] = token

        def on_caller_loop(events: list[TransactionEvent], read_to: int) -> None:
            if self._followed.get(partition) is token:  # not stopped (nor replaced) since it was read
                deliver(events, read_to)

        loop = self._tails_loop()
        loop.call_soon_threadsafe(self._start, partition, start, caller, on_caller_loop, tuple(settling))
        log.debug("event=txn_tail_started topic=%s partition=%d from_offset=%d", self.topic, partition, start)

    def stop(self, partitions: Collection[int]) -> None:
        """Stop following: nothing read of them is delivered from now on."""
        stopped = [p for p in partitions if self._followed.pop(p, None) is not None]
        if stopped and self._loop is not None:
            self._loop.call_soon_threadsafe(self._cancel, stopped)
            log.info("event=txn_tail_stopped topic=%s partitions=%s", self.topic, sorted(stopped))

    async def close(self, timeout_s: float = 5.0) -> None:
        self._followed.clear()
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        stopped = asyncio.run_coroutine_threadsafe(self._cancel_all(), loop)
        try:  # bounded: a connection that does not close must not hold the coordinator's shutdown
            await asyncio.wait_for(asyncio.wrap_future(stopped), timeout_s)
        except asyncio.TimeoutError:
            log.warning("event=txn_tails_close_timeout topic=%s timeout_s=%.1f (tails left to the daemon thread)",
                        self.topic, timeout_s)
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, timeout_s)

    # -- the tails' thread ---------------------------------------------------------------------------------------
    def _tails_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=_run_forever, args=(loop,), name="txn-tails", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    def _start(self, partition: int, start: int, caller: asyncio.AbstractEventLoop, deliver: Deliver,
               settling: tuple[int, ...]) -> None:
        self._cancel([partition])
        task = asyncio.get_running_loop().create_task(self._tail(partition, start, caller, deliver, settling),
                                                      name=f"txn-tail-{partition}")
        self._tasks[partition] = task
        task.add_done_callback(lambda done: self._tasks.pop(partition, None) if self._tasks.get(partition) is done
                               else None)

    def _cancel(self, partitions: Collection[int]) -> None:
        for partition in partitions:
            task = self._tasks.pop(partition, None)
            if task is not None:
                task.cancel()

    async def _cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._lookups is not None:
            await self._lookups.close()

    async def _name_producers(self, producer_ids: set[int]) -> None:
        """Ask which of these producer ids are ours, on connections the tails share (one set per broker)."""
        if self._lookups is None:
            self._lookups = PartitionLeaders(self.bootstrap, self.security, self.topic, self.max_bytes,
                                             lambda: False)
        if not self._lookups.brokers:
            await self._lookups.refresh([])
        try:
            states = await transaction_states(self._lookups, producer_ids, complete=True)  # none named by default
        except BaseException:
            self._lookups.brokers = []  # a broker gone or moved: ask Metadata again next time
            raise
        self.owners.learn(producer_ids, states)

    async def _tail(self, partition: int, start: int, caller: asyncio.AbstractEventLoop, deliver: Deliver,
                    settling: tuple[int, ...]) -> None:
        tail = _Tail(partition, PartitionLeaders(self.bootstrap, self.security, self.topic, self.max_bytes,
                                                 lambda: False), start, TailReader(settling))
        try:
            while True:
                try:
                    await self._step(tail, caller, deliver)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a lost connection, a leader moved, a malformed answer: never the end
                    tail.position = await self._recover(tail.leaders, partition, tail.position, exc)
                    tail.found_data = True  # read on promptly from where it stands
        finally:
            await tail.leaders.close()

    async def _step(self, tail: _Tail, caller: asyncio.AbstractEventLoop, deliver: Deliver) -> None:
        """One fetch from the tail's position (waiting as its last fetch's finding says), its events delivered."""
        leaders, partition = tail.leaders, tail.partition
        if partition not in leaders.leaders:
            await leaders.refresh([partition])
            await _close_all_but(leaders, leaders.leaders[partition])  # the Metadata connection is not kept
        client = await leaders.connect(leaders.leaders[partition])
        if tail.frame is None:
            tail.frame = FetchFrame(client.client_id, self.topic, partition, max_bytes=self.max_bytes)
        wait_ms, min_bytes = (self.max_wait_ms, self.min_bytes) if tail.found_data else (self.idle_wait_ms, 1)
        self.fetches += 1
        answer = await tail.frame.fetch(client, self.topic, partition, tail.position, max_wait_ms=wait_ms,
                                        min_bytes=min_bytes, timeout_ms=wait_ms + 30_000,
                                        wants_records=tail.reader.wants_records(self.owners.is_ours))
        unknown = self.owners.unknown(answer.batches)
        if unknown:
            await self._name_producers(unknown)
            if unnamed := self.owners.unknown(answer.batches):
                raise ProducersUnlisted(sorted(unnamed))
        events = tail.reader.events(answer.batches, self.owners.is_ours)
        next_position = _next_position(answer, tail.position)
        tail.found_data = bool(answer.batches)
        if events:  # handed over and waited for: one fetch's worth in memory at most
            await asyncio.wrap_future(_call_on(caller, deliver, events, next_position))
        tail.position = next_position

    async def _recover(self, leaders: PartitionLeaders, partition: int, position: int, exc: Exception) -> int:
        """Where to read on after `exc`: the log start if the position is out of range, else the same position
        after a pause, with new metadata (most errors are a leadership change or a broker restarting)."""
        if isinstance(exc, ProducersUnlisted):  # logged once per producer id by ProducerOwners
            await asyncio.sleep(_RETRY_S)
            return position
        if isinstance(exc, FetchError) and exc.error_code == _OFFSET_OUT_OF_RANGE:
            try:
                earliest = await self._log_start(leaders, partition)
            except asyncio.CancelledError:
                raise
            except Exception as again:
                exc = again
            else:
                log.warning("event=txn_tail_restart topic=%s partition=%d offset=%d reason=offset_out_of_range "
                            "from_offset=%d", self.topic, partition, position, earliest)
                return earliest
        routine = isinstance(exc, FetchError) and exc.error_code in RETRIABLE_FETCH_ERRORS  # leadership moving
        log.log(logging.INFO if routine else logging.WARNING, "event=txn_tail_restart topic=%s partition=%d "
                "offset=%d reason=%r retry_in_s=%.1f", self.topic, partition, position, exc, _RETRY_S)
        await asyncio.sleep(_RETRY_S)
        leaders.leaders.pop(partition, None)
        return position

    async def _log_start(self, leaders: PartitionLeaders, partition: int) -> int:
        request_class = apis.request_class(_LIST_OFFSETS, 4)
        topic_class = item_class(request_class, "topics")
        request = build(request_class, replica_id=i32(-1), isolation_level=0, topics=(build(
            topic_class, name=self.topic, partitions=(build(
                item_class(topic_class, "partitions"), partition_index=i32(partition), current_leader_epoch=i32(-1),
                timestamp=i64(_EARLIEST)),)),))
        if partition not in leaders.leaders:
            await leaders.refresh([partition])
        answer = await tolerant_request(await leaders.connect(leaders.leaders[partition]), request)
        for topic in answer.topics:
            for answered in topic.partitions:
                if int(answered.partition_index) == partition:
                    if int(answered.error_code) != 0:
                        raise FetchError(int(answered.error_code), f"ListOffsets {self.topic}-{partition}: error "
                                                                   f"{int(answered.error_code)}")
                    return int(answered.offset)
        raise ProtocolError(f"ListOffsets answer without {self.topic}-{partition}")


@dataclass(slots=True)
class _Tail:
    """One followed partition's reading state (the tails' thread only)."""

    partition: int
    leaders: PartitionLeaders
    position: int
    reader: TailReader = dataclass_field(default_factory=TailReader)
    found_data: bool = True  # the last fetch found batches (at the start: catch up from the load's end)
    frame: FetchFrame | None = None


async def _close_all_but(leaders: PartitionLeaders, address: tuple[str, int]) -> None:
    for other in [a for a in leaders.clients if a != address]:
        await leaders.clients.pop(other).close()


def _next_position(answer: FetchedPartition, position: int) -> int:
    if answer.next_offset == position and answer.log_start_offset > position:
        return answer.log_start_offset  # deleted below us meanwhile (retention, compaction)
    return answer.next_offset


def _call_on(loop: asyncio.AbstractEventLoop, deliver: Deliver, events: list[TransactionEvent],
             read_to: int) -> concurrent.futures.Future[None]:
    async def run() -> None:
        deliver(events, read_to)
    return asyncio.run_coroutine_threadsafe(run(), loop)


def _run_forever(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()
