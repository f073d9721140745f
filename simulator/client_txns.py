"""Clients' transactions: exactly-once applications that commit their offsets with TxnOffsetCommit inside a
producer transaction, the cluster's transaction coordinator that ends them, and the partition leader's checks.

`ClientTransactions` is the cluster side, on SimKafka: per transactional id the producer id, its epoch and the
transaction's state (Kafka's TransactionMetadata: Empty, Ongoing, PrepareCommit/PrepareAbort, CompleteCommit/
CompleteAbort); InitProducerId bumps the epoch and aborts what the previous instance left open (fencing it); a
transaction open past transaction.timeout.ms is aborted with an epoch bump; EndTxn writes the COMMIT or ABORT
marker into every state partition of the transaction (held while the broker is down). The partition leader
checks a client's transactional batch as Kafka's ProducerStateManager does: the epoch (an older one is
INVALID_PRODUCER_EPOCH), the partition being in the transaction (Produce v11; v12 adds it, KIP-890), the
sequence (a duplicate of one of the last five batches is answered with its first offset, a gap is
OUT_OF_ORDER_SEQUENCE_NUMBER, a new epoch starts at 0), then Kafka's write faults as for our own writes.

`SimRelay` is what the production TxnOffsetCommit handler (coordinator/server/handlers/txn_offset_commit.py)
reaches the cluster through: Metadata for the partition's leader, the Produce of the client's batch (its bytes
parsed back with the production fetch reader), and the transaction's verification when the group refuses a
request (FindCoordinator of the transactional id, DescribeTransactions answered with the frame a broker sends).

`TxnProbe` is a zombie of those applications: a producer whose consumer group metadata is of a generation long
gone (and whose producer id or epoch may be too), so the group refuses its TxnOffsetCommit and the handler verifies
the transaction at the transaction coordinator before answering — made common, with the verification's own faults
(`VerificationFaults`: FindCoordinator and DescribeTransactions answered with errors or not at all, transactions held
in PrepareCommit/PrepareAbort).

`TransactionalApp` is a consume-transform-produce loop (a Java producer with `sendOffsetsToTransaction`, a
read_committed consumer): it fetches its group's offsets with require_stable, begins a transaction, adds the
group's state partition (AddOffsetsToTxn, TV1) or lets TxnOffsetCommit v5 add it (TV2), commits the offsets of
what it processed through the coordinator, and commits (most often), aborts, or stalls past its transaction
timeout; it can crash mid-transaction, or be replaced by a new instance of the same transactional id while it
hangs (a zombie: fenced when it comes back).
"""
from __future__ import annotations

import asyncio
import random
import struct
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from coordinator.group.api import OffsetFetchRequest, OffsetFetchRequestTopic
from coordinator.group.partitioner import partition_for
from coordinator.storage.records import OffsetCommitKey, decode_key, decode_offset_commit_value
from coordinator.relay.errors import UpstreamUnavailable
from protocol.apis import ApiKey, request_class
from protocol.error_codes import Errors
from protocol.fetch_reader import parse_batches
from protocol.group_fastpath import uvarint
from protocol.messages import build, item_class
from simulator.instance import Disconnected, Route
from simulator.invariants import TXN_GROUP_PREFIX, verification_text

if TYPE_CHECKING:
    from simulator.run import Simulation

PRODUCE_TIMEOUT_MS = 5_000
TRANSACTIONAL_ID_PREFIX = "txn-app-"  # an application's transactional id: the prefix and its number
_PRODUCE, _DESCRIBE_TRANSACTIONS = 0, 65  # API keys protocol.apis.ApiKey does not name
_ADD_PARTITIONS_TO_TXN = 24
_DUPLICATES_KEPT = 5  # batches per producer and partition a leader recognises as duplicates (Kafka's 5)
# what a TxnOffsetCommit may answer a transactional producer (anything else is a violation of no_errors)
_RETRIABLE = frozenset({Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                        Errors.REQUEST_TIMED_OUT, Errors.CONCURRENT_TRANSACTIONS, Errors.UNKNOWN_TOPIC_OR_PARTITION,
                        Errors.NOT_ENOUGH_REPLICAS})
_FENCED = frozenset({Errors.INVALID_PRODUCER_EPOCH, Errors.PRODUCER_FENCED})
_ABORTABLE = frozenset({Errors.INVALID_TXN_STATE, Errors.TRANSACTION_ABORTABLE, Errors.INVALID_PRODUCER_ID_MAPPING,
                        Errors.OUT_OF_ORDER_SEQUENCE_NUMBER})


@dataclass(frozen=True)
class VerificationFaults:
    """Faults of the transaction's verification (scenarios with a `TxnProbe`): each FindCoordinator of a
    transactional id or DescribeTransactions answered with a retriable error, each attempt of either left
    unanswered (the relay waits its upstream timeout and tries once more), and how long the transaction
    coordinator holds PrepareCommit/PrepareAbort before it writes the markers."""

    find_error: float
    describe_error: float
    timeout: float
    prepare_hold_ms: tuple[int, int]


UPSTREAM_TIMEOUT_MS = 30_000  # the relay's timeout of its own requests to the cluster (RelayConfig.upstream_timeout_ms)
_TC_ERRORS = (Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR, Errors.COORDINATOR_LOAD_IN_PROGRESS)


@dataclass(frozen=True)
class Described:
    """What the transaction coordinator said of a transactional id when a verification asked."""

    state: str
    producer_id: int
    epoch: int
    partitions: frozenset[int]


# a verification's outcome: the state described, None (no such transactional id), or the error that left it
# unverified (the handler answers COORDINATOR_NOT_AVAILABLE)
Verification = Described | Errors | None


@dataclass
class _Txn:
    """One transactional id's state at the transaction coordinator."""

    transactional_id: str
    producer_id: int
    epoch: int
    timeout_ms: int
    tv2: bool
    state: str = "Empty"
    partitions: set[int] = field(default_factory=set)
    number: int = 0  # the transaction's number (the checker's key with the transactional id)
    start_ms: int = -1  # when the transaction began (-1: none since InitProducerId)


@dataclass
class _ProducerState:
    """The partition leader's state of one producer id."""

    epoch: int
    last_sequence: int = -1
    recent: list[tuple[int, int, int]] = field(default_factory=list)  # (first, last sequence, base offset)


class ClientTransactions:
    def __init__(self, sim: Simulation, rng: random.Random) -> None:
        self.sim = sim
        self.kafka = sim.kafka
        self.rng = rng
        self._by_id: dict[str, _Txn] = {}
        self._producers: dict[tuple[int, int], _ProducerState] = {}  # (partition, producer id)
        self._next_producer_id = 1_000
        self.prepare_hold_ms = (0, 0)  # how long PrepareCommit/PrepareAbort lasts before the markers

    def _record(self, kind: str, **fields: Any) -> None:
        self.sim.history.record(kind, **fields)

    # --- the transaction coordinator --------------------------------------------------------------------------
    async def init_producer_id(self, transactional_id: str, timeout_ms: int, tv2: bool) -> tuple[int, int]:
        txn = self._by_id.get(transactional_id)
        if txn is None:
            txn = self._by_id[transactional_id] = _Txn(transactional_id, self._next_producer_id, -1, timeout_ms, tv2)
            self._next_producer_id += 1
        while txn.state.startswith("Prepare"):  # CONCURRENT_TRANSACTIONS: the client retries
            await asyncio.sleep(0.05)
        if txn.state == "Ongoing":  # the previous instance's transaction: aborted, the instance fenced
            txn.epoch += 1
            await self._ended(txn, commit=False, why="fenced")
        txn.epoch += 1
        txn.timeout_ms, txn.tv2 = timeout_ms, tv2
        txn.state, txn.start_ms = "Empty", -1  # Kafka's InitProducerId leaves the id Empty
        self._record("txn_init", tid=transactional_id, pid=txn.producer_id, epoch=txn.epoch)
        return txn.producer_id, txn.epoch

    def add_partition(self, transactional_id: str, producer_id: int, epoch: int, partition: int) -> Errors:
        """AddOffsetsToTxn (TV1): the group's state partition joins the transaction."""
        txn = self._by_id.get(transactional_id)
        if txn is None or txn.producer_id != producer_id or txn.epoch != epoch:
            return Errors.PRODUCER_FENCED
        return self._join(txn, partition)

    def _join(self, txn: _Txn, partition: int) -> Errors:
        if txn.state.startswith("Prepare"):
            return Errors.CONCURRENT_TRANSACTIONS
        if txn.state != "Ongoing":
            txn.state = "Ongoing"
            txn.number += 1
            txn.partitions = set()
            txn.start_ms = self.sim.now_ms()
            self.sim.loop.call_later(txn.timeout_ms / 1000, self._time_out, txn, txn.number)
            self._record("txn_begin", tid=txn.transactional_id, n=txn.number)
        txn.partitions.add(partition)
        return Errors.NONE

    async def end_txn(self, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> tuple[Errors, int]:
        """EndTxn; the error and the epoch to go on with (TV2 bumps it at every end)."""
        txn = self._by_id.get(transactional_id)
        if txn is None or txn.producer_id != producer_id or txn.epoch != epoch:
            return Errors.PRODUCER_FENCED, epoch
        if txn.state.startswith("Prepare"):
            return Errors.CONCURRENT_TRANSACTIONS, epoch
        if txn.state != "Ongoing":  # nothing was added: nothing to end
            return Errors.NONE, epoch
        if txn.tv2:
            txn.epoch += 1
        await self._ended(txn, commit, "commit" if commit else "abort")
        return Errors.NONE, txn.epoch

    def _time_out(self, txn: _Txn, number: int) -> None:
        if txn.state == "Ongoing" and txn.number == number:
            txn.epoch += 1  # the timed-out producer is fenced (it re-initialises)
            self.sim.loop.create_task(self._end(txn, commit=False, why="timeout"))

    async def _ended(self, txn: _Txn, commit: bool, why: str) -> None:
        """The transaction coordinator ends it whatever becomes of the client that asked."""
        await asyncio.shield(self.sim.loop.create_task(self._end(txn, commit, why)))

    async def _end(self, txn: _Txn, commit: bool, why: str) -> None:
        """PrepareCommit/PrepareAbort, the markers into every partition of the transaction, Complete."""
        txn.state = "PrepareCommit" if commit else "PrepareAbort"
        number, partitions = txn.number, sorted(txn.partitions)
        markers: dict[int, int] = {}
        self._record("txn_prepare", tid=txn.transactional_id, n=number, commit=commit, why=why)
        if self.prepare_hold_ms[1]:
            await asyncio.sleep(self.rng.randint(*self.prepare_hold_ms) / 1000)
        for partition in partitions:
            while True:
                await asyncio.sleep(self.rng.randint(1, 30) / 1000)
                if self.kafka.is_up:
                    break
                await self.kafka.wait_up(self.sim.now_ms() + 3_600_000)
            offset = markers[partition] = self.kafka.append_marker(partition, txn.producer_id, txn.epoch, commit)
            txn.partitions.discard(partition)  # DescribeTransactions lists only partitions still without a marker
            self._record("txn_marker", tid=txn.transactional_id, n=number, partition=partition, offset=offset,
                         commit=commit)
        self.sim.checkers.txn_ended(txn.transactional_id, number, commit, markers)
        txn.state = "CompleteCommit" if commit else "CompleteAbort"
        txn.partitions = set()

    def described(self, transactional_id: str) -> _Txn | None:
        """The transaction coordinator's state of a transactional id (DescribeTransactions); None if unknown."""
        return self._by_id.get(transactional_id)

    # --- the partition leader ---------------------------------------------------------------------------------
    async def produce(self, partition: int, transactional_id: str, batch: Any, adds: bool) -> tuple[Errors, int]:
        """A client's transactional batch (a TxnOffsetCommit's): the error and the base offset."""
        kafka, faults = self.kafka, self.kafka.faults
        deadline_ms = self.sim.now_ms() + PRODUCE_TIMEOUT_MS
        if not await kafka.wait_up(deadline_ms):
            return Errors.REQUEST_TIMED_OUT, -1
        await asyncio.sleep(self.rng.randint(*faults.land_ms) / 1000)
        txn = self._by_id.get(transactional_id)
        if txn is None or txn.producer_id != batch.producer_id:
            return Errors.INVALID_PRODUCER_ID_MAPPING, -1
        if batch.producer_epoch < txn.epoch:
            return Errors.INVALID_PRODUCER_EPOCH, -1
        if adds:
            error = self._join(txn, partition) if txn.epoch == batch.producer_epoch else Errors.INVALID_PRODUCER_EPOCH
            if error != Errors.NONE:
                return error, -1
        elif txn.state != "Ongoing" or partition not in txn.partitions:
            return Errors.INVALID_TXN_STATE, -1
        count = batch.last_offset - batch.base_offset + 1
        first, last = batch.base_sequence, batch.base_sequence + count - 1
        state = self._producers.get((partition, batch.producer_id))
        if state is not None and state.epoch == batch.producer_epoch:
            for seen_first, seen_last, base in state.recent:
                if (seen_first, seen_last) == (first, last):
                    return Errors.NONE, base  # a duplicate: answered with its first offset
            if first != state.last_sequence + 1:
                return Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
        elif first != 0:  # a new epoch (or a producer new to the partition) starts at 0
            return Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
        roll = self.rng.random()
        if not kafka.is_up:
            return Errors.REQUEST_TIMED_OUT, -1
        if roll < faults.refuse:
            return Errors.NOT_ENOUGH_REPLICAS, -1
        if state is None or state.epoch != batch.producer_epoch:
            state = self._producers[(partition, batch.producer_id)] = _ProducerState(batch.producer_epoch)
        base = kafka.append_client_batch(partition, batch.producer_id, batch.producer_epoch, first,
                                         [(r.key, r.value) for r in batch.records])
        state.last_sequence = last
        state.recent = (state.recent + [(first, last, base)])[-_DUPLICATES_KEPT:]
        for index, record in enumerate(batch.records):
            key = decode_key(record.key)
            if isinstance(key, OffsetCommitKey) and record.value is not None:
                self.sim.checkers.txn_offset_landed(key.group, (key.topic, key.partition),
                                                    decode_offset_commit_value(record.value).offset,
                                                    (transactional_id, txn.number), (partition, base + index))
        self._record("txn_batch", tid=transactional_id, partition=partition, offset=base, seq=first,
                     epoch=batch.producer_epoch)
        if roll < faults.refuse + faults.after_append:
            return Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND, -1
        if roll >= 1 - faults.ack_lost:
            await asyncio.sleep(max(deadline_ms - self.sim.now_ms(), 0) / 1000)
            return Errors.REQUEST_TIMED_OUT, -1
        return Errors.NONE, base


class SimRelay:
    """The relay's calls the TxnOffsetCommit handler makes, on SimKafka: Metadata (the leaders of the state topic),
    Produce of a client batch to its leader, and the transaction's verification (FindCoordinator of the
    transactional id, DescribeTransactions at that coordinator, its frame undecoded)."""

    BROKER = 1  # the one simulated broker leads every partition and is every transaction coordinator

    def __init__(self, sim: Simulation, transactions: ClientTransactions, topic: str, partitions: int,
                 faults: VerificationFaults | None = None, rng: random.Random | None = None) -> None:
        self.sim = sim
        self.transactions = transactions
        self.topic = topic
        self.partitions = partitions
        self.cluster = self  # relay.cluster.missing(): every topic of the run exists
        self._correlation_id = 0
        self.faults = faults
        self.rng = rng or random.Random(0)
        self.verifications: list[tuple[str, Verification]] = []  # (transactional id, outcome), in order

    def _verified(self, transactional_id: str, outcome: Verification) -> None:
        self.verifications.append((transactional_id, outcome))
        self.sim.history.record("txn_verification", tid=transactional_id, outcome=verification_text(outcome))

    async def _unanswered(self, transactional_id: str) -> None:
        """The relay's attempts at a verification request: each one may go unanswered (its upstream timeout,
        then once more, as `Relay.request`/`request_to` do); UpstreamUnavailable after two."""
        if self.faults is None:
            return
        for rate in (self.faults.timeout, 0.5):  # a transaction coordinator that did not answer often stays silent
            if self.rng.random() >= rate:
                return
            await asyncio.sleep(UPSTREAM_TIMEOUT_MS / 1000)
        self._verified(transactional_id, Errors.REQUEST_TIMED_OUT)
        raise UpstreamUnavailable("the transaction coordinator did not answer (simulated timeouts)")

    def _injected(self, transactional_id: str, rate: float) -> Errors:
        """A retriable error the verification request is answered with (NONE: none)."""
        if self.faults is None or self.rng.random() >= rate:
            return Errors.NONE
        error = self.rng.choice(_TC_ERRORS)
        self._verified(transactional_id, error)
        return error

    async def missing(self, partitions: Any) -> set[tuple[str, int]]:
        return set()

    async def request(self, body: Any) -> Any:
        """Metadata of the state topic, or FindCoordinator (v4+) of transactional ids."""
        await asyncio.sleep(self.sim.latency_ms() / 1000)
        api_key = int(body.__api_key__)
        finding = api_key == ApiKey.FIND_COORDINATOR and body.key_type == 1
        if finding:
            await self._unanswered(body.coordinator_keys[0])
        if not self.sim.kafka.is_up:
            if finding:
                self._verified(body.coordinator_keys[0], Errors.COORDINATOR_NOT_AVAILABLE)
            raise UpstreamUnavailable("the cluster is down")
        if api_key == ApiKey.METADATA:
            return SimpleNamespace(topics=[SimpleNamespace(name=self.topic, error_code=0, partitions=[
                SimpleNamespace(partition_index=p, leader_id=self.BROKER) for p in range(self.partitions)])])
        if finding:
            errors = [self._injected(key, self.faults.find_error if self.faults else 0.0)
                      for key in body.coordinator_keys]
            return SimpleNamespace(throttle_time=0, coordinators=[SimpleNamespace(
                key=key, node_id=self.BROKER, host="sim-kafka", port=9092, error_code=int(error), error_message=None)
                for key, error in zip(body.coordinator_keys, errors)])
        raise NotImplementedError(f"the simulated relay does not serve API {api_key} v{body.__version__}")

    async def request_to(self, node_id: int, body: Any, *, undecoded: bool = False) -> Any:
        """A Produce of one client batch (Produce v12 adds the partition to the transaction), or
        DescribeTransactions (undecoded: its response frame, correlation id first, as the relay returns it)."""
        await asyncio.sleep(self.sim.latency_ms() / 1000)
        api_key = int(body.__api_key__)
        if api_key == _PRODUCE:
            return await self._produce(body)
        if api_key == _DESCRIBE_TRANSACTIONS and undecoded:
            transactional_id = body.transactional_ids[0]
            await self._unanswered(transactional_id)
            if not self.sim.kafka.is_up:
                self._verified(transactional_id, Errors.COORDINATOR_NOT_AVAILABLE)
                raise UpstreamUnavailable(f"broker {node_id} did not answer: the cluster is down")
            self._correlation_id += 1
            error = self._injected(transactional_id, self.faults.describe_error if self.faults else 0.0)
            if error != Errors.NONE:
                frame = describe_transactions_frame(self._correlation_id, [(transactional_id, error, self.topic)])
            else:
                described: list[tuple[str, _Txn | Errors | None, str]] = [
                    (tid, self.transactions.described(tid), self.topic) for tid in body.transactional_ids]
                for tid, txn, _ in described:
                    assert not isinstance(txn, Errors)
                    self._verified(tid, None if txn is None else Described(
                        txn.state, txn.producer_id, txn.epoch, frozenset(txn.partitions)))
                frame = describe_transactions_frame(self._correlation_id, described)
            await asyncio.sleep(self.sim.latency_ms() / 1000)
            return frame
        if api_key == _ADD_PARTITIONS_TO_TXN and not undecoded:
            return await self._add_partitions(body)
        raise NotImplementedError(f"the simulated relay does not serve API {api_key} v{body.__version__} "
                                  f"(undecoded={undecoded}) to a broker")

    async def _add_partitions(self, body: Any) -> Any:
        """AddPartitionsToTxn as a broker sends it (the handler adds the state partition to a transaction whose
        v5 TxnOffsetCommit the group refused)."""
        if not self.sim.kafka.is_up:
            raise UpstreamUnavailable("the cluster is down")
        results = []
        for txn in body.transactions:
            topics = [SimpleNamespace(name=topic.name, results_by_partition=[SimpleNamespace(
                partition_index=p, partition_error_code=int(self.transactions.add_partition(
                    txn.transactional_id, int(txn.producer_id), int(txn.producer_epoch), int(p))))
                for p in topic.partitions]) for topic in txn.topics]
            results.append(SimpleNamespace(transactional_id=txn.transactional_id, topic_results=topics))
        await asyncio.sleep(self.sim.latency_ms() / 1000)
        return SimpleNamespace(throttle_time=0, error_code=0, results_by_transaction=results)

    async def _produce(self, body: Any) -> Any:
        data = body.topic_data[0].partition_data[0]
        batch = parse_batches(bytes(data.records))[0]
        error, base = await self.transactions.produce(int(data.index), body.transactional_id, batch,
                                                      adds=body.__version__ >= 12)
        await asyncio.sleep(self.sim.latency_ms() / 1000)
        return SimpleNamespace(responses=[SimpleNamespace(partition_responses=[
            SimpleNamespace(error_code=int(error), base_offset=base)])])


def _compact_string(value: str) -> bytes:
    data = value.encode()
    return uvarint(len(data) + 1) + data


def describe_transactions_frame(correlation_id: int, described: list[tuple[str, _Txn | Errors | None, str]]
                                ) -> bytes:
    """A DescribeTransactions v0 response frame as a broker sends it, without the size: response header v1
    (correlation id, tagged fields), throttle time, the transaction states (compact strings and arrays, tagged
    fields). An unknown id is TRANSACTIONAL_ID_NOT_FOUND with the schema's defaults, an error the same way."""
    no_tags = uvarint(0)
    out = bytearray(struct.pack(">i", correlation_id) + no_tags + struct.pack(">i", 0))
    out += uvarint(len(described) + 1)
    for transactional_id, txn, topic in described:
        if txn is None or isinstance(txn, Errors):
            error = Errors.TRANSACTIONAL_ID_NOT_FOUND if txn is None else txn
            out += struct.pack(">h", error) + _compact_string(transactional_id)
            out += _compact_string("") + struct.pack(">iqqh", 0, 0, 0, 0) + uvarint(1) + no_tags
            continue
        out += struct.pack(">h", Errors.NONE) + _compact_string(transactional_id) + _compact_string(txn.state)
        out += struct.pack(">iqqh", txn.timeout_ms, txn.start_ms, txn.producer_id, txn.epoch)
        partitions = sorted(txn.partitions)
        if partitions:
            out += uvarint(2) + _compact_string(topic) + uvarint(len(partitions) + 1)
            out += b"".join(struct.pack(">i", p) for p in partitions) + no_tags
        else:
            out += uvarint(1)
        out += no_tags
    return bytes(out + no_tags)


def txn_offset_commit_request(version: int, transactional_id: str, group_id: str, producer_id: int, epoch: int,
                              offsets: dict[tuple[str, int], int], *, generation_id: int = -1,
                              member_id: str = "") -> Any:
    cls = request_class(28, version)
    topic_class = item_class(cls, "topics")
    partition_class = item_class(topic_class, "partitions")
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append((partition, offset))
    fields: dict[str, Any] = {}
    if version >= 3:
        fields = {"generation_id": generation_id, "member_id": member_id, "group_instance_id": None}
    return build(cls, transactional_id=transactional_id, group_id=group_id, producer_id=producer_id,
                 producer_epoch=epoch, topics=tuple(topic_class(name=topic, partitions=tuple(
                     build(partition_class, partition_index=p, committed_offset=o, committed_metadata="")
                     for p, o in parts)) for topic, parts in by_topic.items()), **fields)


class Fenced(Exception):
    pass


class TransactionalApp:
    """One instance of an exactly-once application (its transactional id and its group's partitions)."""

    def __init__(self, sim: Simulation, number: int, incarnation: int, topics: dict[str, int], tv2: bool,
                 version: int, timeout_ms: int, rng: random.Random) -> None:
        self.sim = sim
        self.transactional_id = f"{TRANSACTIONAL_ID_PREFIX}{number}"
        self.group_id = f"{TXN_GROUP_PREFIX}{number}"
        self.name = f"{self.transactional_id}#{incarnation}"
        self.partitions = [(t, p) for t, n in sorted(topics.items()) for p in range(n)]
        self.tv2, self.version, self.timeout_ms = tv2, version, timeout_ms
        self.rng = rng
        self.route = Route()
        self.stopped = False
        self.hang_until_ms = 0
        self.task: asyncio.Task[None] | None = None
        self.producer_id, self.epoch = -1, -1
        self.replaced = False  # a newer instance of the transactional id runs: fenced means the end

    @property
    def ctc(self) -> ClientTransactions:
        assert self.sim.client_transactions is not None  # a run with applications has one
        return self.sim.client_transactions

    def start(self) -> None:
        self.task = self.sim.loop.create_task(self._run())

    def crash(self) -> None:
        self.stopped = True
        if self.task is not None:
            self.task.cancel()

    async def _sleep(self, ms: int) -> None:
        await asyncio.sleep(ms / 1000)
        if self.hang_until_ms > self.sim.now_ms():
            await asyncio.sleep((self.hang_until_ms - self.sim.now_ms()) / 1000)

    async def _run(self) -> None:
        try:
            await self._init()
            while not self.stopped:
                await self._fetch(stable=True)
                if self.rng.random() < 0.2:
                    await self._fetch(stable=False)
                try:
                    await self._transaction()
                except Fenced:
                    self.sim.history.record("txn_app_fenced", client=self.name, replaced=self.replaced)
                    if self.replaced:  # ProducerFencedException: fatal, the zombie closes
                        return
                    await self._init()  # fenced by its own transaction's timeout: a new producer
                await self._sleep(self.rng.randint(100, 2_000))
        except asyncio.CancelledError:
            raise

    async def _init(self) -> None:
        await self._sleep(self.sim.latency_ms())
        self.producer_id, self.epoch = await self.ctc.init_producer_id(self.transactional_id, self.timeout_ms,
                                                                       self.tv2)

    async def _call(self, api: str, request: Any) -> Any:
        if self.hang_until_ms > self.sim.now_ms():
            await asyncio.sleep((self.hang_until_ms - self.sim.now_ms()) / 1000)
        try:
            return await self.sim.call(self.name, "", api, request, route=self.route)
        except Disconnected:
            await asyncio.sleep(self.rng.randint(100, 1_000) / 1000)
            return None

    async def _fetch(self, stable: bool) -> None:
        """What a read_committed consumer fetches when it gets its partitions (require_stable), retried while
        UNSTABLE_OFFSET_COMMIT (bounded: the application goes on without)."""
        by_topic: dict[str, list[int]] = {}
        for topic, partition in self.partitions:
            by_topic.setdefault(topic, []).append(partition)
        request = OffsetFetchRequest(self.group_id, [OffsetFetchRequestTopic(t, ps) for t, ps in by_topic.items()],
                                     require_stable=stable)
        for _ in range(20):
            sent_ms = self.sim.now_ms()
            response = await self._call("fetch_offsets", request)
            if response is None or response.error_code != Errors.NONE:
                await asyncio.sleep(self.rng.randint(100, 1_000) / 1000)
                continue
            unstable = False
            for topic in response.topics:
                for p in topic.partitions:
                    self.sim.checkers.txn_fetched(self.group_id, (topic.name, p.partition_index), p.committed_offset,
                                                  p.error_code, stable, sent_ms, self.name)
                    unstable |= p.error_code == Errors.UNSTABLE_OFFSET_COMMIT
            if not unstable:
                return
            self.sim.history.record("txn_unstable", client=self.name)
            await asyncio.sleep(self.rng.randint(50, 500) / 1000)

    async def _transaction(self) -> None:
        ctc, checkers = self.ctc, self.sim.checkers
        if not self.tv2:
            partition = partition_for(self.group_id, self.sim.config.offsets_topic_num_partitions)
            error = ctc.add_partition(self.transactional_id, self.producer_id, self.epoch, partition)
            if error != Errors.NONE:
                raise Fenced(error.name)
        wanted = self.rng.sample(self.partitions, self.rng.randint(1, len(self.partitions)))
        offsets = {tp: self.sim.next_offset(self.group_id, tp) for tp in sorted(wanted)}
        committed = await self._commit_offsets(offsets)
        if self.rng.random() < 0.1:  # stalls past its transaction timeout: the coordinator aborts it
            await self._sleep(self.timeout_ms + self.rng.randint(0, 5_000))
        commit = committed and self.rng.random() < 0.75
        error, self.epoch = await ctc.end_txn(self.transactional_id, self.producer_id, self.epoch, commit)
        self.sim.history.record("txn_end", client=self.name, commit=commit, error=error.name)
        if error in _FENCED:
            raise Fenced(error.name)
        if error != Errors.NONE:
            checkers.unexpected_error(self.name, "end_txn", error)

    async def _commit_offsets(self, offsets: dict[tuple[str, int], int]) -> bool:
        """TxnOffsetCommit until answered NONE (retriable errors retried, bounded); whether it was."""
        checkers = self.sim.checkers
        for _ in range(8):
            request = txn_offset_commit_request(self.version, self.transactional_id, self.group_id,
                                                self.producer_id, self.epoch, offsets)
            response = await self._call("txn_offset_commit", request)
            if response is None:
                continue
            errors = {Errors(int(p.error_code)) for t in response.topics for p in t.partitions}
            if errors == {Errors.NONE}:
                checkers.txn_offsets_pending(self.group_id, offsets, self.name)
                return True
            if errors & _FENCED:
                raise Fenced(",".join(sorted(e.name for e in errors)))
            unexpected = errors - _RETRIABLE - _ABORTABLE - {Errors.NONE}
            for error in sorted(unexpected):
                checkers.unexpected_error(self.name, "txn_offset_commit", error)
            if errors & _ABORTABLE or unexpected:
                return False
            await asyncio.sleep(self.rng.randint(100, 1_000) / 1000)
        return False


@dataclass(frozen=True)
class ProbedApp:
    transactional_id: str
    group_id: str
    topics: dict[str, int]
    tv2: bool

    @staticmethod
    def of(number: int, topics: dict[str, int], tv2: bool) -> ProbedApp:
        """Application `number`'s transactional id and group."""
        return ProbedApp(f"{TRANSACTIONAL_ID_PREFIX}{number}", f"{TXN_GROUP_PREFIX}{number}", topics, tv2)


class TxnProbe:
    """A zombie of the exactly-once applications, sending TxnOffsetCommit (v3+) with consumer group metadata of a
    generation that is gone (a generation >= 0, a member id the group does not have) for an application's
    transactional id: with the producer id and epoch its transaction coordinator has now, an older epoch, another
    producer id, or for a transactional id nobody initialised. The group refuses it, so the handler asks the
    transaction coordinator first; `txn_verification` checks the answer against what it was told."""

    _IDENTITIES = ("current", "current", "older_epoch", "other_producer", "unknown_id")

    def __init__(self, sim: Simulation, relay: SimRelay, apps: list[ProbedApp], every_ms: tuple[int, int],
                 rng: random.Random) -> None:
        self.sim, self.relay, self.apps, self.every_ms, self.rng = sim, relay, apps, every_ms, rng
        self.name = "txn-zombie"
        self.route = Route()
        self._sent = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.rng.randint(*self.every_ms) / 1000)
            await self._probe(self.rng.choice(self.apps))

    async def _probe(self, app: ProbedApp) -> None:
        rng, sim = self.rng, self.sim
        transactional_id = app.transactional_id
        txn = self.relay.transactions.described(transactional_id)
        producer_id, epoch = (txn.producer_id, txn.epoch) if txn is not None else (1_000, 0)
        identity = rng.choice(self._IDENTITIES)
        if identity == "older_epoch":
            epoch = max(epoch - rng.randint(1, 3), 0)
        elif identity == "other_producer":
            producer_id += 500
        elif identity == "unknown_id":
            transactional_id += "-never-initialised"
        version = 5 if app.tv2 else rng.choice((3, 4))
        topic = rng.choice(sorted(app.topics))
        offsets = {(topic, p): sim.next_offset(app.group_id, (topic, p)) for p in range(app.topics[topic])}
        self._sent += 1
        request = txn_offset_commit_request(version, transactional_id, app.group_id, producer_id, epoch, offsets,
                                            generation_id=rng.randint(1, 9), member_id=f"zombie-{self._sent}")
        asked = len(self.relay.verifications)
        try:
            response = await sim.call(self.name, "", "txn_offset_commit", request, route=self.route)
        except Disconnected:
            await asyncio.sleep(rng.randint(100, 1_000) / 1000)
            return
        answers = {Errors(int(p.error_code)) for t in response.topics for p in t.partitions}
        outcomes = [outcome for tid, outcome in self.relay.verifications[asked:] if tid == transactional_id]
        state_partition = partition_for(app.group_id, sim.config.offsets_topic_num_partitions)
        sim.checkers.txn_refused(self.name, transactional_id, producer_id, epoch, version, state_partition,
                                 answers, outcomes)
