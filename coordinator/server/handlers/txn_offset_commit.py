"""TxnOffsetCommit (28), v0–5: a client's offsets appended to the group's state partition inside its transaction.

The offsets are written as a transactional record batch *of the client's producer* (its transactional id,
producer id and epoch; the sequence is ours, coordinator/group/txn_sequences.py), in Kafka's offset-commit record
format, with our own Produce to the partition's leader. Produce v11 (TxnOffsetCommit v0–4) only verifies that the
partition is in the transaction (the relay added it at AddOffsetsToTxn); v12 (TxnOffsetCommit v5) adds it. Once
the leader acknowledged the batch its offsets are pending on the shard at their record offsets, settled by the
transaction coordinator's COMMIT/ABORT marker that the partition's tail reads (coordinator/storage/txn_tail.py).

As KafkaApis: WRITE on the transactional id, then READ on the group (every partition refused otherwise), READ on
each topic, partitions the cluster does not have → UNKNOWN_TOPIC_OR_PARTITION; then the group's checks
(coordinator/group/txn_commit.py) and, per partition, OFFSET_METADATA_TOO_LARGE. A refused append is answered with
every partition's error mapped per version (`txn_append_error`). Kafka has the transaction verified before the group's
checks: a request the group refuses is answered with the transaction coordinator's error if it has one
(txn_verification.py). So is an append the leader answers NOT_ENOUGH_REPLICAS, its Produce path's answer to a
verification that failed retriably (CONCURRENT_TRANSACTIONS while the transaction completes, which Kafka's group
coordinator answers as it is), once sending it again for a moment did not help: the usual cause is the client's own
Produce verified at the same time by the same broker (AddPartitionsToTxnManager answers the older of two
verifications of one transactional id NETWORK_EXCEPTION), and answered, it would cost the client a fixed 500 ms
(librdkafka's retry of TxnOffsetCommit).

One batch per producer id and state partition at a time: requests of the same producer wait for each other while
their group is checked and their batch appended; a refused request's verification, which may wait out the
transaction coordinator's timeouts, is not held under that lock (Kafka does not serialise a producer's requests; the
group is checked again once it is verified). A batch whose outcome is unknown (no answer, a timeout) is owed: the
next request of that producer first sends those same bytes again with the same sequence (the leader answers a
duplicate with its first offset), so a client's retry never meets OUT_OF_ORDER_SEQUENCE_NUMBER.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

from kio.records.schema import NewRecordBatch, Record as BatchRecord
from kio.records.writers import write_new_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from coordinator.group.api import UNKNOWN_MEMBER_ID
from coordinator.group.offsets import java_length
from coordinator.group.records import OffsetCommitRecord, OffsetRecord
from coordinator.group.shard import GroupShard
from coordinator.group.status import ShardStatus
from coordinator.group.txn_commit import (ADDING_MIN_VERSION, ANSWERED_BEFORE_VERIFICATION, TxnOffsetCommitIdentity,
                                          txn_append_error, validate_transactional_offset_commit)
from coordinator.group.txn_offsets import replay_transactional_offsets
from coordinator.group.txn_sequences import Busy, Outcome
from coordinator.relay.errors import UpstreamUnavailable
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from coordinator.server.handlers.txn_verification import (answer_after_verification, busy_retry_pauses, error_code,
                                                          unverified_append_error)
from coordinator.storage.records import encode
from protocol.apis import ApiKey, request_class, response_class
from protocol.client import KafkaClient
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY = ApiKey.TXN_OFFSET_COMMIT
VERSIONS = (0, 5)  # Kafka 4.1.1's (its ApiVersions answer)

_PRODUCE = 0
_METADATA, _METADATA_VERSION = 3, 12
_TRANSACTIONAL = 0x10  # record batch attribute bit
VERIFYING_PRODUCE_VERSION = 11  # the leader verifies the partition is in the transaction (TV1)
ADDING_PRODUCE_VERSION = 12  # the leader adds the partition to the transaction (TV2)
COMMIT_TIMEOUT_MS = 5_000  # Kafka's offsets.commit.timeout.ms
# Kafka's coordinator refuses a batch above the state topic's max.message.bytes (RecordTooLarge, answered
# UNKNOWN_SERVER_ERROR); checked before the batch is built, with the record overheads the store's writer counts
MAX_BATCH_BYTES = 1_000_000
_BATCH_OVERHEAD_BYTES, _RECORD_OVERHEAD_BYTES = 61, 21
_VALUE_FIXED_BYTES = 30  # an offset commit value without its metadata string
# Produce answers after which the batch may be in the log all the same
_OUTCOME_UNKNOWN = frozenset((Errors.REQUEST_TIMED_OUT, Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                              Errors.NETWORK_EXCEPTION))
# Produce answers that say the partition's leader moved: ask Metadata again before the next append
_LEADER_MOVED = frozenset((Errors.NOT_LEADER_OR_FOLLOWER, Errors.UNKNOWN_TOPIC_OR_PARTITION,
                           Errors.KAFKA_STORAGE_ERROR))

log = logging.getLogger("coordinator.server")


@dataclass(frozen=True, slots=True)
class ClientProducer:
    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class Appended:
    error: Errors
    base_offset: int  # -1 unless appended (or recognised as a duplicate of an appended batch)


def transactional_batch(producer: ClientProducer, sequence: int, records: Sequence[OffsetCommitRecord],
                        now: datetime.datetime | None = None) -> bytes:
    """The offset records as one transactional v2 record batch of the client's producer."""
    timestamp = TZAwareMicros.parse(now or datetime.datetime.now(datetime.timezone.utc))
    encoded = [encode(record) for record in records]
    buffer = io.BytesIO()
    write_new_batch(buffer, NewRecordBatch(
        producer_id=i64(producer.producer_id), producer_epoch=i16(producer.producer_epoch),
        base_sequence=i32(sequence), attributes=i16(_TRANSACTIONAL),
        records=tuple(BatchRecord(attributes=i8(0), timestamp=timestamp, offset=i64(index), key=key, value=value,
                                  headers=()) for index, (key, value) in enumerate(encoded))))
    return buffer.getvalue()


def produce_request(producer: ClientProducer, topic: str, partition: int, batch: bytes, *, produce_version: int,
                    timeout_ms: int) -> Any:
    """One Produce (acks=all) of `batch` with the client's transactional id."""
    cls = request_class(_PRODUCE, produce_version)
    topic_data = item_class(cls, "topic_data")
    partition_data = item_class(topic_data, "partition_data")
    return build(
        cls, transactional_id=producer.transactional_id, acks=i16(-1),
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=(topic_data(name=topic, partition_data=(partition_data(index=i32(partition), records=batch),)),))


def appended(answer: Any) -> Appended:
    result = answer.responses[0].partition_responses[0]
    code = error_code(result.error_code)
    return Appended(code, int(result.base_offset) if code == Errors.NONE else -1)


async def append_transactional_batch(leader: KafkaClient, producer: ClientProducer, topic: str, partition: int,
                                     batch: bytes, *, produce_version: int, timeout_ms: int) -> Appended:
    """One Produce (acks=all) of `batch` with the client's transactional id; the partition's answer."""
    answer = await leader.request(produce_request(producer, topic, partition, batch, produce_version=produce_version,
                                                  timeout_ms=timeout_ms), timeout_ms=timeout_ms + 5_000)
    return appended(answer)


# --- the request ------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Partition:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str


@dataclass(slots=True)
class _Owed:
    """A batch of unknown outcome: sent again, byte for byte, before anything else of its producer."""

    epoch: int
    sequence: int
    batch: bytes
    records: list[OffsetCommitRecord]
    produce_version: int


@dataclass(slots=True)
class _ShardWrites:
    """Per shard: which producer has a batch on its way (requests of one producer wait for each other), the
    batches owed again, and where the partition's leader is."""

    locks: dict[int, tuple[asyncio.Lock, int]] = field(default_factory=dict)  # producer id -> (lock, users)
    owed: dict[int, _Owed] = field(default_factory=dict)
    leader: int | None = None

    @asynccontextmanager
    async def one_batch_of(self, producer_id: int) -> AsyncIterator[None]:
        lock, users = self.locks.get(producer_id) or (asyncio.Lock(), 0)
        self.locks[producer_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self.locks[producer_id]
            if users == 1:
                del self.locks[producer_id]
            else:
                self.locks[producer_id] = (lock, users - 1)


def _writes(shard: GroupShard) -> _ShardWrites:
    """This shard's locks, kept on the shard (dropped with it)."""
    writes = shard.handler_state.get("txn_offset_commit")
    if writes is None:
        writes = shard.handler_state["txn_offset_commit"] = _ShardWrites()
    return cast(_ShardWrites, writes)


def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    version = header.api_version
    wanted = _partitions(body)
    if not ctx.allows(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, body.transactional_id):
        return _answer(version, wanted, {}, Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not ctx.allows(Operation.READ, ResourceType.GROUP, body.group_id):
        return _answer(version, wanted, {}, Errors.GROUP_AUTHORIZATION_FAILED)
    return _commit(ctx, version, body, wanted)


def _partitions(body: Any) -> list[_Partition]:
    return [_Partition(str(topic.name), int(p.partition_index), int(p.committed_offset),
                       int(getattr(p, "committed_leader_epoch", -1)), p.committed_metadata or "")
            for topic in body.topics for p in topic.partitions]


async def _commit(ctx: ConnectionContext, version: int, body: Any, wanted: list[_Partition]) -> Any:
    errors: dict[tuple[str, int], Errors] = {}
    for topic in {p.topic for p in wanted}:
        if not ctx.allows(Operation.READ, ResourceType.TOPIC, topic):
            errors.update({(p.topic, p.partition): Errors.TOPIC_AUTHORIZATION_FAILED for p in wanted
                           if p.topic == topic})
    if ctx.relay is not None:
        missing = await ctx.relay.cluster.missing(
            [(p.topic, p.partition) for p in wanted if (p.topic, p.partition) not in errors])
        errors.update(dict.fromkeys(missing, Errors.UNKNOWN_TOPIC_OR_PARTITION))
    # a partition given twice: the last one counts, as in Kafka's map
    rest = list({(p.topic, p.partition): p for p in wanted if (p.topic, p.partition) not in errors}.values())
    if rest:
        errors.update(await _commit_to_group(ctx, version, body, rest))
    return _answer(version, wanted, errors, Errors.NONE)


async def _commit_to_group(ctx: ConnectionContext, version: int, body: Any, partitions: list[_Partition]
                           ) -> dict[tuple[str, int], Errors]:
    identity = TxnOffsetCommitIdentity(
        transactional_id=body.transactional_id, producer_id=int(body.producer_id),
        producer_epoch=int(body.producer_epoch), group_id=body.group_id,
        generation_id=int(getattr(body, "generation_id", -1)),
        member_id=getattr(body, "member_id", UNKNOWN_MEMBER_ID),
        group_instance_id=getattr(body, "group_instance_id", None), version=version)
    shard = ctx.coordinator.shard_for(identity.group_id)  # behind the zombie guard with several instances
    existed = identity.group_id in shard.groups
    # The transaction coordinator may take its timeouts to answer a verification: it is asked outside the
    # producer's batch lock, so the producer's other requests (Kafka does not serialise them) do not wait for it
    verified = await _verification(ctx, identity, validate_transactional_offset_commit(shard, identity)[1])
    while True:
        shard = ctx.coordinator.shard_for(identity.group_id)
        writes = _writes(shard)
        async with writes.one_batch_of(identity.producer_id):
            refused = _group_refusal(shard, identity, verified)
            if (refused is None or refused in ANSWERED_BEFORE_VERIFICATION or verified is not None
                    or _verifiable(ctx, identity) is None):
                return await _commit_locked(ctx, shard, writes, identity, partitions, existed, refused)
        # the group refused it only once this request had the lock: verified like any request it refuses
        verified = await _verification(ctx, identity, refused)


@dataclass(frozen=True, slots=True)
class _Verified:
    group_error: Errors  # what the group refused the request with before the verification
    answer: Errors  # the verification's answer (`group_error` when the transaction coordinator found nothing)


def _verifiable(ctx: ConnectionContext, identity: TxnOffsetCommitIdentity) -> tuple[Any, tuple[str, int]] | None:
    """The relay and the group's state partition to verify a transaction with; None without a cluster."""
    state = ctx.coordinator.state_partition(identity.group_id)
    return None if ctx.relay is None or state is None else (ctx.relay, state)


async def _verification(ctx: ConnectionContext, identity: TxnOffsetCommitIdentity, group_error: Errors | None
                        ) -> _Verified | None:
    """The transaction coordinator's answer to a request the group refused; None if accepted, unverifiable, or
    refused before any verification (the partition not led here, moving: Kafka answers those first). Such a request
    is not verified yet: if the group refuses it otherwise once it has the lock (the partition loaded meanwhile), it
    is verified then, as Kafka verifies before the group's own checks."""
    cluster = _verifiable(ctx, identity)
    if group_error is None or group_error in ANSWERED_BEFORE_VERIFICATION or cluster is None:
        return None
    relay, state = cluster
    return _Verified(group_error, await answer_after_verification(relay, identity, state, group_error))


def _group_refusal(shard: GroupShard, identity: TxnOffsetCommitIdentity, verified: _Verified | None
                   ) -> Errors | None:
    """The group checked under the producer's lock. As Kafka, after a verification the group is checked as it is
    then: the verification may have waited out the transaction coordinator's timeouts while the partition moved
    or the group changed; a verification error answers unless the partition moved."""
    if verified is None:
        return validate_transactional_offset_commit(shard, identity)[1]
    moved = shard.group_status_error(identity.group_id)
    if moved is not None:
        return moved
    if verified.answer == verified.group_error:
        return validate_transactional_offset_commit(shard, identity)[1]
    return verified.answer


async def _commit_locked(ctx: ConnectionContext, shard: GroupShard, writes: _ShardWrites,
                         identity: TxnOffsetCommitIdentity, partitions: list[_Partition], existed: bool,
                         invalid: Errors | None) -> dict[tuple[str, int], Errors]:
    every = [(p.topic, p.partition) for p in partitions]
    state = ctx.coordinator.state_partition(identity.group_id)
    if invalid is not None:
        log.info("event=txn_offset_commit_refused group=%s transactional_id=%s producer_id=%d generation=%d "
                 "member=%s version=%d error=%s", identity.group_id, identity.transactional_id, identity.producer_id,
                 identity.generation_id, identity.member_id, identity.version, invalid.name)
        return dict.fromkeys(every, invalid)
    errors: dict[tuple[str, int], Errors] = {}
    now_ms = shard.now_wall_ms()
    records = []
    for p in partitions:
        if java_length(p.metadata) > shard.config.offset_metadata_max_bytes:
            errors[(p.topic, p.partition)] = Errors.OFFSET_METADATA_TOO_LARGE
        else:
            records.append(OffsetCommitRecord(identity.group_id, p.topic, p.partition,
                                              OffsetRecord(p.offset, p.leader_epoch, p.metadata, now_ms)))
    if not records:
        return errors
    refused = _refusal(ctx, identity, records)
    if refused is None:
        refused = await _append(ctx, shard, writes, identity, records)
    if refused == Errors.NOT_ENOUGH_REPLICAS and ctx.relay is not None and state is not None:
        refused = await unverified_append_error(ctx.relay, identity, state)
    if shard.status is not ShardStatus.ACTIVE:  # moved meanwhile, appended or not: its new owner answers the retry
        refused = Errors.NOT_COORDINATOR  # (Kafka fails every write still pending at an unload so)
    if refused is not None:
        if not existed:
            _forget_unused_group(shard, identity.group_id)
        answer = txn_append_error(refused, identity.version)
        log.warning("event=txn_offset_commit_failed group=%s transactional_id=%s producer_id=%d epoch=%d "
                    "partitions=%d error=%s answered=%s", identity.group_id, identity.transactional_id,
                    identity.producer_id, identity.producer_epoch, len(records), refused.name, answer.name)
        errors.update(dict.fromkeys(((r.topic, r.partition) for r in records), answer))
    return errors


def _refusal(ctx: ConnectionContext, identity: TxnOffsetCommitIdentity, records: list[OffsetCommitRecord]
             ) -> Errors | None:
    """What refuses the append before anything is sent: no cluster to append to, or a batch too large."""
    if ctx.relay is None or ctx.coordinator.state_partition(identity.group_id) is None:
        return Errors.COORDINATOR_NOT_AVAILABLE  # without the relay no client has a transaction coordinator
    size = _BATCH_OVERHEAD_BYTES + sum(
        _RECORD_OVERHEAD_BYTES + 16 + len(r.group_id.encode()) + len(r.topic.encode()) + _VALUE_FIXED_BYTES
        + len(r.value.metadata.encode()) for r in records if r.value is not None)
    if size > MAX_BATCH_BYTES:
        log.warning("event=txn_offset_commit_too_large group=%s records=%d bytes=%d max_bytes=%d",
                    identity.group_id, len(records), size, MAX_BATCH_BYTES)
        return Errors.MESSAGE_TOO_LARGE
    return None


async def _append(ctx: ConnectionContext, shard: GroupShard, writes: _ShardWrites,
                  identity: TxnOffsetCommitIdentity, records: list[OffsetCommitRecord]) -> Errors | None:
    """Sends what is owed, then this batch; None once it is in the log and pending on the shard."""
    state = ctx.coordinator.state_partition(identity.group_id)
    assert state is not None and ctx.relay is not None
    relay = ctx.relay
    producer_id = identity.producer_id
    sequences = shard.producer_sequences
    life = sequences.forgotten

    async def send(batch: _Owed) -> Errors | None:
        producer = ClientProducer(identity.transactional_id, producer_id, batch.epoch)
        try:
            leader = writes.leader
            if leader is None:
                leader = writes.leader = await _leader_of(relay, state)
        except UpstreamUnavailable as exc:  # nothing sent
            log.warning("event=txn_offset_append_no_leader partition=%s error=%s", state, exc)
            sequences.settle(producer_id, batch.epoch, batch.sequence, Outcome.REFUSED)
            return Errors.COORDINATOR_NOT_AVAILABLE
        # ordered against our tombstones of these offsets by log offset; one sent before lands before it, an owed
        # one is not sent again
        try:
            restore_owed = await shard.transactional_offsets.sending_after_our_tombstones(
                identity.group_id, [(r.topic, r.partition) for r in batch.records])
        except BaseException:  # cancelled before it was sent: owed as one of unknown outcome is (same sequence)
            sequences.settle(producer_id, batch.epoch, batch.sequence, Outcome.UNKNOWN)
            writes.owed[producer_id] = batch
            raise
        try:
            request = produce_request(producer, state[0], state[1], batch.batch,
                                      produce_version=batch.produce_version, timeout_ms=COMMIT_TIMEOUT_MS)
            result = appended(await relay.request_to(leader, request))
            pauses, retries = busy_retry_pauses(), 0
            # NOT_ENOUGH_REPLICAS: nothing appended, the leader could not verify the transaction (busy for a moment:
            # txn_verification.py) or the partition lacks replicas; the same batch, same sequence, again
            while result.error == Errors.NOT_ENOUGH_REPLICAS and (pause := next(pauses, None)) is not None:
                await asyncio.sleep(pause)
                retries += 1
                result = appended(await relay.request_to(leader, request))
        except UpstreamUnavailable as exc:
            log.warning("event=txn_offset_append_unanswered producer_id=%d sequence=%d error=%s",
                        producer_id, batch.sequence, exc)
            writes.leader = None
            result = Appended(Errors.REQUEST_TIMED_OUT, -1)
        except BaseException:  # cancelled: whether it landed is unknown
            restore_owed()
            sequences.settle(producer_id, batch.epoch, batch.sequence, Outcome.UNKNOWN)
            writes.owed[producer_id] = batch
            raise
        if result.error != Errors.NONE:
            restore_owed()
        if result.error in _LEADER_MOVED or result.error in _OUTCOME_UNKNOWN:
            writes.leader = None
        if result.error == Errors.NONE:
            sequences.settle(producer_id, batch.epoch, batch.sequence, Outcome.ACKNOWLEDGED)
            writes.owed.pop(producer_id, None)
            if shard.status is ShardStatus.ACTIVE:  # else the partition moved on: its next owner loads the batch
                replay_transactional_offsets(shard, producer_id, batch.epoch,
                                             [(result.base_offset + i, r) for i, r in enumerate(batch.records)],
                                             transactional_id=identity.transactional_id)
                shard.observer.on_txn_offsets_pending(identity.group_id, identity.transactional_id, producer_id,
                                                      batch.epoch, len(batch.records))
            log.info("event=txn_offsets_pending group=%s transactional_id=%s producer_id=%d epoch=%d offsets=%d "
                     "base_offset=%d version=%d busy_retries=%d", identity.group_id, identity.transactional_id,
                     producer_id, batch.epoch, len(batch.records), result.base_offset, identity.version, retries)
            return None
        if result.error in _OUTCOME_UNKNOWN:
            sequences.settle(producer_id, batch.epoch, batch.sequence, Outcome.UNKNOWN)
            writes.owed[producer_id] = batch
            return result.error
        sequences.settle(producer_id, batch.epoch, batch.sequence, Outcome.REFUSED)
        writes.owed.pop(producer_id, None)
        if result.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER:
            # another writer took our sequence (a former owner's late batch): the tail's read-back moves it on,
            # and the client's retry (a retriable answer) gets the next one
            log.warning("event=txn_offset_sequence_taken producer_id=%d epoch=%d sequence=%d",
                        producer_id, batch.epoch, batch.sequence)
            return Errors.COORDINATOR_NOT_AVAILABLE
        return result.error

    owed = writes.owed.get(producer_id)
    if owed is not None:
        resend = sequences.claim_resend(producer_id)
        if resend is None:  # the log has it (the tail read it back) or the partition was loaded again
            del writes.owed[producer_id]
        elif resend != owed.sequence:
            sequences.settle(producer_id, owed.epoch, resend, Outcome.REFUSED)
            del writes.owed[producer_id]
        elif (failed := await send(owed)) is not None and producer_id in writes.owed:
            return failed  # still of unknown outcome: nothing else of this producer before it
        if sequences.forgotten != life or shard.status is not ShardStatus.ACTIVE:
            # the partition left (and maybe came back) while the owed batch was resent: a sequence claimed now
            # would start from an empty table (0, a duplicate of an early batch: answered NONE, nothing appended)
            # or from a load still reading the log; its new owner answers the client's retry
            return Errors.NOT_COORDINATOR
    try:
        sequence = sequences.claim(producer_id, identity.producer_epoch, len(records))
    except Busy:
        return Errors.COORDINATOR_LOAD_IN_PROGRESS  # retriable: the client sends it again
    produce_version = (ADDING_PRODUCE_VERSION if identity.version >= ADDING_MIN_VERSION
                       else VERIFYING_PRODUCE_VERSION)
    producer = ClientProducer(identity.transactional_id, producer_id, identity.producer_epoch)
    return await send(_Owed(identity.producer_epoch, sequence, transactional_batch(producer, sequence, records),
                            records, produce_version))


async def _leader_of(relay: Any, state: tuple[str, int]) -> int:
    """The state partition's leader, from the cluster's Metadata."""
    cls = request_class(_METADATA, _METADATA_VERSION)
    answer = await relay.request(build(cls, topics=(item_class(cls, "topics")(name=state[0], topic_id=None),),
                                       allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    for topic in answer.topics:
        if topic.name == state[0] and int(topic.error_code) == 0:
            for partition in topic.partitions:
                if int(partition.partition_index) == state[1] and int(partition.leader_id) >= 0:
                    return int(partition.leader_id)
    raise UpstreamUnavailable(f"no leader for {state[0]}-{state[1]} in the cluster's metadata")


def _forget_unused_group(shard: GroupShard, group_id: str) -> None:
    """A group the validation created for offsets that were then not written goes again (Kafka's timeline
    reverts it with the failed write)."""
    group = shard.groups.get(group_id)
    if (group is not None and not group.members and not group.has_offsets
            and not shard.transactional_offsets.has_open_transactions(group_id)):
        del shard.groups[group_id]


def _answer(version: int, wanted: list[_Partition], errors: dict[tuple[str, int], Errors], default: Errors) -> Any:
    """Every partition of the request once, in the request's order."""
    cls = response_class(API_KEY, version)
    topic_class = item_class(cls, "topics")
    partition_class = item_class(topic_class, "partitions")
    by_topic: dict[str, dict[int, Errors]] = {}
    for p in wanted:
        by_topic.setdefault(p.topic, {})[p.partition] = errors.get((p.topic, p.partition), default)
    return build(cls, throttle_time=ZERO_DURATION, topics=tuple(
        topic_class(name=name, partitions=tuple(partition_class(partition_index=i32(index), error_code=error(code))
                                                for index, code in partitions.items()))
        for name, partitions in by_topic.items()))
