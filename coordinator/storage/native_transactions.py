"""The state writer's transactions on our own asyncio Kafka client (protocol/client.py), on the coordinator's loop.

Same surface and semantics as transactions.py's `TransactionalProducer` (librdkafka's), with what librdkafka does
not let us choose:
- CONCURRENT_TRANSACTIONS (Kafka's transaction coordinator still writing the previous commit's markers, ~1-2 ms
  after EndTxn answered) is retried after 1 ms, doubling up to 20 ms (`Backoff`), within the write's deadline;
  librdkafka waits a hard-coded 20 ms per refusal, often 2-4 times, at every back-to-back transaction.
- `open_ahead(partition)` adds the partition to the transaction now (AddPartitionsToTxn) with no marker record.
- A failed transaction (a refusal, sequence trouble, a Produce or EndTxn with no answer) is never aborted with a
  separate EndTxn: the producer re-initialises instead (InitProducerId of the same id with its current producer id
  and epoch, KIP-360), which aborts what was open with an epoch bump (late Produces of the old epoch are refused)
  and resets the sequences; the broker refuses it (PRODUCER_FENCED / INVALID_PRODUCER_EPOCH) if a newer holder
  took the id meanwhile, so a re-initialisation never takes the id back from one.

Transactions v1 requests only (they work on TV1 and TV2 clusters, as librdkafka's do): FindCoordinator (key type
1), InitProducerId v4, AddPartitionsToTxn v3, Produce v9-v11 (acks=-1, one transactional record batch per
partition, no compression), EndTxn v3/v4. Connections: the partitions' leaders and the transaction coordinator,
found and secured as the txn tails' (uncommitted_load.py `PartitionLeaders`, the cluster's ClusterSecurity).

Errors are confluent_kafka KafkaError objects with the codes the librdkafka writer reports (append_errors.py maps
both): broker codes as they are, _MSG_TIMED_OUT for an unknown outcome or a write past its deadline, _FENCED for a
fence.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from kio.records.schema import NewRecordBatch, Record as BatchRecord
from kio.records.writers import write_new_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from coordinator.security.clusters import cluster_security
from coordinator.storage.producer import KafkaRecord
from coordinator.storage import transactions
from coordinator.storage.transaction_queue import Queued, TransactionQueue
from coordinator.storage.uncommitted_load import PartitionLeaders
from protocol import apis
from protocol.client import KafkaClient
from protocol.errors import ConnectionClosed, ProtocolError, RequestTimedOut
from protocol.fetch_reader import tolerant_response
from protocol.messages import build, item_class
from protocol.retry import doubling_pauses

log = logging.getLogger("coordinator.storage")

_PRODUCE, _FIND_COORDINATOR, _INIT_PRODUCER_ID, _ADD_PARTITIONS, _END_TXN = 0, 10, 22, 24, 26
_TRANSACTION_KEY = 1
_TRANSACTIONAL = 0x10  # record batch attribute bit
_MAX_BATCH_BYTES = 1_000_000  # what one Produce request carries (the topic's max.message.bytes is per batch)

# Kafka error codes
_NONE = 0
_UNKNOWN_TOPIC_OR_PARTITION, _NOT_LEADER, _REQUEST_TIMED_OUT = 3, 6, 7
_COORDINATOR_LOAD_IN_PROGRESS, _COORDINATOR_NOT_AVAILABLE, _NOT_COORDINATOR = 14, 15, 16
_NOT_ENOUGH_REPLICAS, _NOT_ENOUGH_REPLICAS_AFTER_APPEND = 19, 20
_INVALID_PRODUCER_EPOCH, _CONCURRENT_TRANSACTIONS = 47, 51
_KAFKA_STORAGE_ERROR, _NETWORK_EXCEPTION, _PRODUCER_FENCED = 56, 13, 90
_COORDINATOR_MOVED = frozenset({_NOT_COORDINATOR, _COORDINATOR_NOT_AVAILABLE, _COORDINATOR_LOAD_IN_PROGRESS})
# the leader moved or is briefly short of replicas, or the append's outcome is unknown: the same batch again
# (same sequence: the leader recognises a duplicate of an appended one)
_PRODUCE_AGAIN = frozenset({_UNKNOWN_TOPIC_OR_PARTITION, _NOT_LEADER, _REQUEST_TIMED_OUT, _NOT_ENOUGH_REPLICAS,
                            _NOT_ENOUGH_REPLICAS_AFTER_APPEND, _KAFKA_STORAGE_ERROR, _NETWORK_EXCEPTION, 74, 75})
FENCED_CODES = frozenset({_INVALID_PRODUCER_EPOCH, _PRODUCER_FENCED, KafkaError._FENCED})
# librdkafka's fatal errors of a transactional producer: with `fatal_is_fence`, a fence
_FATAL_CODES = frozenset({KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                          KafkaError.UNSUPPORTED_VERSION, KafkaError.INVALID_TRANSACTION_TIMEOUT,
                          KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT})
_UNANSWERED = (ProtocolError, ConnectionClosed, RequestTimedOut, OSError, ValueError, asyncio.TimeoutError)

_MIN_TIMEOUT_S = 0.5
_FIRST_BACKOFF_S, _MAX_BACKOFF_S = 0.001, 0.020  # CONCURRENT_TRANSACTIONS
_COORDINATOR_RETRY_S = 0.05  # a coordinator being found, loaded or moved
_INIT_ATTEMPT_S = 10.0
_INIT_RETRY_S = 0.5
_REQUEST_TIMEOUT_MS = 30_000

_PerPartition = dict[int, list[tuple[bytes, "bytes | None", "list[int] | None"]]]  # partition → (key, value, sink)
# a transaction's batches, and its Produce requests sent already per leader (request, raw answer)
_Sent = tuple[dict[int, bytes], dict[tuple[str, int], tuple[Any, "asyncio.Future[Any]"]]]


def _per_partition(batch: list[Queued]) -> _PerPartition:
    per_partition: _PerPartition = {}
    for records, _, _, sink in batch:
        for partition, key, value in records:
            per_partition.setdefault(partition, []).append((key, value, sink))
    return per_partition


def _partition_answers(answer: Any) -> dict[int, tuple[int, int]]:
    return {int(p.index): (int(p.error_code), int(p.base_offset)) for t in answer.responses
            for p in t.partition_responses}


class Backoff:
    """CONCURRENT_TRANSACTIONS retries: 1 ms, doubling, at most 20 ms each (protocol/retry.py), never past
    `deadline`."""

    def __init__(self, deadline: float, clock: Callable[[], float], first_s: float = _FIRST_BACKOFF_S,
                 max_s: float = _MAX_BACKOFF_S) -> None:
        self.deadline = deadline
        self.clock = clock
        self._pauses = doubling_pauses(first_s, max_s)
        self.retries = 0

    def delay(self) -> float | None:
        """How long to wait before the next try; None: past the deadline."""
        left = self.deadline - self.clock()
        if left <= 0:
            return None
        self.retries += 1
        return min(next(self._pauses), left)


class _Failed(Exception):
    """A transaction's failure: the error its writes get and what comes next ("reinit" or "fenced")."""

    def __init__(self, error: KafkaError, then: str) -> None:
        super().__init__(error.str())
        self.error = error
        self.then = then


def _give_up_answer(answer: asyncio.Future[Any], where: str) -> None:
    """A request's answer not there by its transaction's deadline: given up as unanswered (a later answer is
    dropped by the client, which settles only futures not done)."""
    if not answer.done():
        answer.set_exception(asyncio.TimeoutError(f"{where}: no answer by the commit deadline"))


def _broker_error(code: int, where: str) -> KafkaError:
    return KafkaError(code, f"{where}: Kafka error {code}")


def _unknown_outcome(where: str, exc: BaseException | None = None) -> _Failed:
    detail = f"{where}: no answer ({exc!r})" if exc is not None else f"{where}: not done within the commit timeout"
    return _Failed(KafkaError(KafkaError._MSG_TIMED_OUT, detail), "reinit")


class NativeTransactionalProducer(TransactionQueue["asyncio.Task[None]"]):
    """Same surface as transactions.py's TransactionalProducer: send, open_ahead, flush, close, fenced,
    on_fenced, fatal_is_fence, transactions."""

    def __init__(self, topic: str, settings: dict[str, object], name: str, transactional_id: str,
                 timeout_ms: int, on_fenced: Callable[[], None] | None = None,
                 fatal_is_fence: bool = False) -> None:
        super().__init__(topic, name, transactional_id, timeout_ms, on_fenced, fatal_is_fence)
        self.transaction_timeout_ms = max(timeout_ms * 2, 10_000)
        bootstrap = str(settings["bootstrap.servers"])
        self._leaders = PartitionLeaders(bootstrap, cluster_security(bootstrap), topic, _MAX_BATCH_BYTES,
                                         self._past_deadline, client_id=str(settings.get("client.id", name)),
                                         reauthenticate=True)
        self._deadline = 0.0  # of the operation running (the leaders' lookups stop there)
        self._coordinator: tuple[str, int] | None = None
        self.producer_id = -1
        self.epoch = -1
        self._sequences: dict[int, int] = {}
        self._added: set[int] = set()  # partitions in the open transaction
        self._opening: asyncio.Task[None] | None = None
        self.concurrent_transactions_retries = 0  # CONCURRENT_TRANSACTIONS absorbed, for benchmarks and tests
        self.add_partitions_sent = 0  # AddPartitionsToTxn requests (retries included), for benchmarks
        self.produced_early = 0  # transactions whose Produce went out from send()'s own turn, for tests

    def _past_deadline(self) -> bool:
        return time.monotonic() > self._deadline or self._closed

    # -- start ---------------------------------------------------------------------------------------------------
    async def start(self, timeout_ms: int = 60_000, *, attempt_ms: int = int(_INIT_ATTEMPT_S * 1000)) -> None:
        """Register the transactional id (InitProducerId: fences an older holder and aborts its open
        transaction), retried while the cluster starts, until `timeout_ms`; then KafkaException."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + timeout_ms / 1000
        while True:
            try:
                await self._init_producer_id(min(deadline, loop.time() + attempt_ms / 1000), fresh=True)
                break
            except _Failed as failed:
                if failed.then == "fenced" or loop.time() >= deadline or self._closed:
                    raise KafkaException(failed.error) from None
                log.info("event=transactions_init_waiting producer=%s transactional_id=%s waited_ms=%d "
                         "timeout_ms=%d error=%s writer=native", self.name, self.transactional_id,
                         (loop.time() - started) * 1000, timeout_ms, failed.error)
                await asyncio.sleep(min(_INIT_RETRY_S, max(deadline - loop.time(), 0)))
        self._ready = True
        self._worker = loop.create_task(self._run(), name=f"{self.name}-transactions")

    # -- opened ahead -----------------------------------------------------------------------------------------------
    def open_ahead(self, partition: int, marker: KafkaRecord | None = None) -> None:
        """A write to `partition` is expected soon: while the producer is idle, the partition is added to the
        transaction now (no marker record: `marker` is ignored). The next write commits it; with none within
        OPEN_AHEAD_HOLD_S, the transaction is committed alone."""
        if partition in self._added or self._committing is not None or self._opening is not None \
                or self._queue or not self._ready or self._closed or self._fenced is not None:
            return
        loop = asyncio.get_running_loop()
        self._opening = loop.create_task(self._open_ahead(partition), name=f"{self.name}-open-ahead")
        if self._open_ahead_expiry is None:
            self._open_ahead_expiry = loop.call_later(transactions.OPEN_AHEAD_HOLD_S, self._commit_opened_alone)

    async def _open_ahead(self, partition: int) -> None:
        try:
            self._deadline = time.monotonic() + self.timeout_ms / 1000
            await self._add_partitions({partition}, asyncio.get_running_loop().time() + self.timeout_ms / 1000)
        except _Failed as failed:  # left to the next write's transaction (it adds the partition itself)
            log.debug("event=transaction_open_ahead_failed producer=%s error=%s", self.name, failed.error)
        except Exception:
            log.exception("event=transaction_open_ahead_failed producer=%s", self.name)
        finally:
            self._opening = None

    def _commit_opened_alone(self) -> None:
        """Also while the partition is still being added (a slow AddPartitionsToTxn): a transaction left open with
        no timer would be aborted by Kafka at its timeout with an epoch bump, which fences us."""
        self._open_ahead_expiry = None
        if (self._added or self._opening is not None) and self._committing is None and not self._queue \
                and self._ready and not self._closed:
            self._begin_commit(asyncio.get_running_loop())

    # -- transactions (loop side) -----------------------------------------------------------------------------------
    async def _await_commit(self) -> None:
        assert self._committing is not None
        await asyncio.gather(self._committing, return_exceptions=True)  # the task does its own aftermath

    def _begin_commit(self, loop: asyncio.AbstractEventLoop) -> None:
        """The next transaction, of every queued write. Its partitions added ahead (`open_ahead`) and their
        leaders' connections open: its Produce is sent here, on this loop turn (a task's first step runs a turn
        later, behind whatever else the turn holds: a rebalance's thousand SyncGroups)."""
        batch, self._queue = self._queue, []
        self._in_flight = len(batch)
        self._cancel_open_ahead_expiry()
        deadline = min((d for _, _, d, _ in batch), default=loop.time() + self.timeout_ms / 1000)
        deadline = max(deadline, loop.time() + _MIN_TIMEOUT_S)
        per_partition = _per_partition(batch)
        early = None
        if self._opening is None and self._fenced is None and per_partition and set(per_partition) <= self._added:
            try:
                early = self._produce_now(per_partition, deadline)
            except Exception:  # our bug: never in send()'s caller; the task produces as usual
                log.exception("event=transaction_early_produce_failed producer=%s", self.name)
        self._committing = loop.create_task(self._transaction(batch, deadline, per_partition, early),
                                            name=f"{self.name}-commit")

    async def _transaction(self, batch: list[Queued], deadline: float, per_partition: _PerPartition,
                           early: _Sent | None) -> None:
        loop = asyncio.get_running_loop()
        error: KafkaError | None = None
        then: str | None = None
        try:
            if self._opening is not None:
                await asyncio.gather(self._opening, return_exceptions=True)
            self._deadline = time.monotonic() + (deadline - loop.time())
            await self._commit(per_partition, deadline, early)
        except _Failed as failed:
            error, then = failed.error, failed.then
        except asyncio.CancelledError:
            error, then = KafkaError(KafkaError._TIMED_OUT, "state producer closed mid-commit"), "reinit"
        except Exception as exc:  # our bug: the transaction's state is unknown
            log.exception("event=transaction_failed producer=%s", self.name)
            error, then = KafkaError(KafkaError._FAIL, f"transaction failed: {exc!r}"), "reinit"
        self._added.clear()
        self._settle_transaction(batch, error, then == "fenced")  # a fence told before its writes are settled
        self._committing = None
        self._in_flight = 0
        if then == "reinit":
            if error is not None and error.code() not in FENCED_CODES:
                log.warning("event=transaction_failed producer=%s error=%s writer=native", self.name, error)
            self._ready = False
            self._start_reinit()
        elif self._queue and not self._closed and self._ready:
            self._expire(loop.time())
            if self._queue:
                self._begin_commit(loop)
        self._wake.set()

    async def _commit(self, per_partition: _PerPartition, deadline: float, early: _Sent | None) -> None:
        """Add the partitions not added yet, produce a batch per partition (sent already: `early`), EndTxn
        commit; raises _Failed."""
        if self._fenced is not None:
            raise _Failed(self._fenced, "fenced")
        missing = set(per_partition) - self._added
        if missing:
            await self._add_partitions(missing, deadline)
        if per_partition:
            await self._produce(per_partition, deadline, early)
        if self._added:  # else nothing was opened (a partition added ahead that failed): no transaction to end
            await self._end_txn(deadline)

    # -- requests --------------------------------------------------------------------------------------------------
    async def _request(self, client: KafkaClient, body: Any, deadline: float, where: str) -> Any:
        """Sent now, on the caller's loop turn (not a turn later as a coroutine wrapped by wait_for would be: on a
        loop busy with a thousand SyncGroups a turn is milliseconds); its answer read as tolerant_request does."""
        if deadline - asyncio.get_running_loop().time() <= 0:
            raise _unknown_outcome(where)
        return await self._answer(body, client.send(body, timeout_ms=_REQUEST_TIMEOUT_MS, raw=True), deadline, where)

    async def _answer(self, body: Any, answer: asyncio.Future[Any], deadline: float, where: str) -> Any:
        """The answer to `body` (sent: its raw future), read as tolerant_request does, by the deadline. The answer
        awaited directly, its deadline a timer that fails it (`_give_up_answer`): `asyncio.wait_for` would put two
        loop turns between the answer and this coroutine (its waiter's callback, then the task's wake-up) where
        awaiting it puts one, and each of a transaction's three round trips pays them on a loop that a thousand
        members' heartbeats keep busy."""
        loop = asyncio.get_running_loop()
        late = loop.call_later(max(deadline - loop.time(), 0.0001), _give_up_answer, answer, where)
        try:
            frame = await answer
            return tolerant_response(int(body.__api_key__), int(body.__version__), frame)
        except _UNANSWERED as exc:
            raise _unknown_outcome(where, exc) from None
        finally:
            late.cancel()

    async def _connection(self, address: tuple[str, int], deadline: float, where: str) -> KafkaClient:
        """The open connection to `address` at once (no loop turn), else a new one within the deadline."""
        client = self._leaders.clients.get(address)
        if client is not None and not client.is_closed:
            return client
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(self._leaders.connect(address), max(deadline - loop.time(), 0.001))
        except _UNANSWERED as exc:
            raise _unknown_outcome(where, exc) from None

    async def _coordinator_client(self, deadline: float) -> KafkaClient:
        """The transaction coordinator's connection (found with FindCoordinator first if not known)."""
        while self._coordinator is None:
            client = await self._connection(self._leaders.bootstrap, deadline, "FindCoordinator")
            request = build(apis.request_class(_FIND_COORDINATOR, 4), key_type=i8(_TRANSACTION_KEY),
                            coordinator_keys=(self.transactional_id,))
            found = (await self._request(client, request, deadline, "FindCoordinator")).coordinators[0]
            code = int(found.error_code)
            if code == _NONE:
                self._coordinator = (str(found.host), int(found.port))
                break
            self._raise_if_refused(code, "FindCoordinator", retriable=_COORDINATOR_MOVED)
            await self._sleep(_COORDINATOR_RETRY_S, deadline, "FindCoordinator", code)
        try:
            return await self._connection(self._coordinator, deadline, "transaction coordinator connection")
        except _Failed:
            self._coordinator = None
            raise

    async def _sleep(self, delay: float, deadline: float, where: str, code: int) -> None:
        if asyncio.get_running_loop().time() + delay >= deadline:
            raise _Failed(KafkaError(KafkaError._MSG_TIMED_OUT, f"{where}: still refused (Kafka error {code}) at "
                                     f"the commit timeout"), "reinit")
        await asyncio.sleep(delay)

    def _raise_if_refused(self, code: int, where: str, *, retriable: frozenset[int]) -> None:
        if code in retriable:
            return
        if code in FENCED_CODES or (self.fatal_is_fence and code in _FATAL_CODES):
            raise _Failed(KafkaError(KafkaError._FENCED, f"fenced: {where}: Kafka error {code}"), "fenced")
        raise _Failed(_broker_error(code, where), "reinit")

    async def _coordinator_call(self, build_request: Callable[[KafkaClient], Any], where: str, deadline: float,
                                code_of: Callable[[Any], int], again: frozenset[int] = frozenset()) -> Any:
        """A request to the transaction coordinator, again after CONCURRENT_TRANSACTIONS (1 ms, doubling to
        20 ms), after a coordinator move (found again) and after the codes `again` (briefly). The answer without
        an error, else _Failed."""
        loop = asyncio.get_running_loop()
        backoff = Backoff(deadline, loop.time)
        while True:
            client = await self._coordinator_client(deadline)
            answer = await self._request(client, build_request(client), deadline, where)
            code = code_of(answer)
            if code == _NONE:
                return answer
            if code == _CONCURRENT_TRANSACTIONS:
                delay = backoff.delay()
                if delay is None:
                    raise _Failed(_broker_error(code, where), "reinit")
                self.concurrent_transactions_retries += 1
                await asyncio.sleep(delay)
                continue
            self._raise_if_refused(code, where, retriable=_COORDINATOR_MOVED | again)
            if code in _COORDINATOR_MOVED and code != _COORDINATOR_LOAD_IN_PROGRESS:
                self._coordinator = None
            await self._sleep(_COORDINATOR_RETRY_S, deadline, where, code)

    async def _init_producer_id(self, deadline: float, *, fresh: bool) -> None:
        """InitProducerId: `fresh` as a new producer of the id (fences any older holder); else with our producer
        id and epoch (KIP-360: aborts our open transaction with an epoch bump, refused if a newer holder has the
        id: fenced)."""
        self._deadline = time.monotonic() + (deadline - asyncio.get_running_loop().time())
        producer_id, epoch = (-1, -1) if fresh or self.producer_id < 0 else (self.producer_id, self.epoch)

        def request(_client: KafkaClient) -> Any:
            return build(apis.request_class(_INIT_PRODUCER_ID, 4), transactional_id=self.transactional_id,
                         transaction_timeout=datetime.timedelta(milliseconds=self.transaction_timeout_ms),
                         producer_id=i64(producer_id), producer_epoch=i16(epoch))

        answer = await self._coordinator_call(request, "InitProducerId", deadline, lambda a: int(a.error_code))
        self.producer_id, self.epoch = int(answer.producer_id), int(answer.producer_epoch)
        self._sequences.clear()
        self._added.clear()

    async def _add_partitions(self, partitions: set[int], deadline: float) -> None:
        def request(_client: KafkaClient) -> Any:
            self.add_partitions_sent += 1
            cls = apis.request_class(_ADD_PARTITIONS, 3)
            topic = item_class(cls, "v3_and_below_topics")
            return build(cls, v3_and_below_transactional_id=self.transactional_id,
                         v3_and_below_producer_id=i64(self.producer_id),
                         v3_and_below_producer_epoch=i16(self.epoch),
                         v3_and_below_topics=(topic(name=self.topic,
                                                    partitions=tuple(i32(p) for p in sorted(partitions))),))

        def code_of(answer: Any) -> int:
            codes = [int(p.partition_error_code) for t in answer.results_by_topic_v3_and_below
                     for p in t.results_by_partition]
            # one partition's real refusal makes the others OPERATION_NOT_ATTEMPTED (55)
            return next((c for c in codes if c not in (_NONE, 55)), _NONE)

        # a topic just created: the transaction coordinator's broker may not know it yet (librdkafka retries too)
        await self._coordinator_call(request, "AddPartitionsToTxn", deadline, code_of,
                                     again=frozenset({_UNKNOWN_TOPIC_OR_PARTITION}))
        self._added |= partitions

    async def _end_txn(self, deadline: float) -> None:
        def request(client: KafkaClient) -> Any:
            version = client.version_for(_END_TXN, 4) if client.api_versions else 3
            return build(apis.request_class(_END_TXN, max(version, 3)), transactional_id=self.transactional_id,
                         producer_id=i64(self.producer_id), producer_epoch=i16(self.epoch), committed=True)

        await self._coordinator_call(request, "EndTxn", deadline, lambda a: int(a.error_code))

    def _produce_now(self, per_partition: _PerPartition, deadline: float) -> _Sent | None:
        """The Produce requests of `per_partition` sent now, if every leader is known and connected; else None."""
        by_leader: dict[tuple[str, int], list[int]] = {}
        for partition in sorted(per_partition):
            leader = self._leaders.leaders.get(partition)
            client = self._leaders.clients.get(leader) if leader is not None else None
            if leader is None or client is None or client.is_closed:
                return None
            by_leader.setdefault(leader, []).append(partition)
        batches = self._batches(per_partition)
        sent: dict[tuple[str, int], tuple[Any, asyncio.Future[Any]]] = {}
        for leader, partitions in by_leader.items():
            client = self._leaders.clients[leader]
            body = self._produce_body(client, {p: batches[p] for p in partitions}, deadline)
            sent[leader] = (body, client.send(body, timeout_ms=_REQUEST_TIMEOUT_MS, raw=True))
        self.produced_early += 1
        return batches, sent

    def _batches(self, per_partition: _PerPartition) -> dict[int, bytes]:
        timestamp = TZAwareMicros.parse(datetime.datetime.now(datetime.timezone.utc))
        return {p: self._batch(p, [(k, v) for k, v, _ in records], timestamp) for p, records in per_partition.items()}

    async def _produce(self, per_partition: _PerPartition, deadline: float, early: _Sent | None = None) -> None:
        """One transactional batch per partition, to each leader (in parallel), again while the leader moves;
        the records' offsets into their writes' sinks; the sequences advanced. `early`: the batches, and the
        first round's requests, sent already (`_produce_now`)."""
        batches = early[0] if early is not None else self._batches(per_partition)
        base_offsets: dict[int, int] = {}
        pending = set(batches)
        if early is not None:
            pending = self._produced(await self._answers(early[1], deadline), base_offsets)
            if pending:
                await self._sleep(_COORDINATOR_RETRY_S, deadline, "Produce", _NOT_LEADER)
        while pending:
            if not all(p in self._leaders.leaders for p in pending):
                await self._refresh(pending, deadline)
            by_leader: dict[tuple[str, int], list[int]] = {}
            for p in sorted(pending):
                by_leader.setdefault(self._leaders.leaders[p], []).append(p)
            sends = [self._produce_to(leader, {p: batches[p] for p in partitions}, deadline)
                     for leader, partitions in by_leader.items()]
            # one leader (one partition's write, the usual case): awaited here, not a task a loop turn later
            answers = [await sends[0]] if len(sends) == 1 else await asyncio.gather(*sends)
            pending = self._produced(answers, base_offsets)
            if pending:
                await self._sleep(_COORDINATOR_RETRY_S, deadline, "Produce", _NOT_LEADER)
        for partition, records in per_partition.items():
            self._sequences[partition] = (self._sequences.get(partition, 0) + len(records)) & 0x7FFFFFFF
            for index, (_, _, sink) in enumerate(records):
                if sink is not None:
                    sink.append(base_offsets[partition] + index)

    def _produced(self, answers: list[dict[int, tuple[int, int]]], base_offsets: dict[int, int]) -> set[int]:
        """The partitions to produce again (their leader moved, or the outcome is unknown); raises a refusal."""
        again: set[int] = set()
        for answered in answers:
            for partition, (code, base_offset) in answered.items():
                if code == _NONE:
                    base_offsets[partition] = base_offset
                elif code in _PRODUCE_AGAIN:
                    again.add(partition)
                    self._leaders.leaders.pop(partition, None)
                else:
                    self._raise_if_refused(code, "Produce", retriable=frozenset())
        return again

    async def _answers(self, sent: dict[tuple[str, int], tuple[Any, asyncio.Future[Any]]], deadline: float
                       ) -> list[dict[int, tuple[int, int]]]:
        answers = []
        for body, answer in sent.values():
            read = await self._answer(body, answer, deadline, "Produce")
            answers.append(_partition_answers(read))
        return answers

    async def _refresh(self, partitions: set[int], deadline: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(self._leaders.refresh(sorted(partitions)), max(deadline - loop.time(), 0.001))
        except Exception as exc:  # UncommittedLoadError past the deadline, or the wait's timeout
            raise _unknown_outcome("Metadata", exc) from None

    def _batch(self, partition: int, records: list[tuple[bytes, bytes | None]],
               timestamp: TZAwareMicros) -> bytes:
        buffer = io.BytesIO()
        write_new_batch(buffer, NewRecordBatch(
            producer_id=i64(self.producer_id), producer_epoch=i16(self.epoch),
            base_sequence=i32(self._sequences.get(partition, 0)), attributes=i16(_TRANSACTIONAL),
            records=tuple(BatchRecord(attributes=i8(0), timestamp=timestamp, offset=i64(index), key=key,
                                      value=value, headers=()) for index, (key, value) in enumerate(records))))
        return buffer.getvalue()

    async def _produce_to(self, leader: tuple[str, int], batches: dict[int, bytes], deadline: float
                          ) -> dict[int, tuple[int, int]]:
        """partition → (error code, base offset). No answer: the outcome is unknown (_Failed)."""
        client = await self._connection(leader, deadline, "Produce")
        request = self._produce_body(client, batches, deadline)
        return _partition_answers(await self._request(client, request, deadline, "Produce"))

    def _produce_body(self, client: KafkaClient, batches: dict[int, bytes], deadline: float) -> Any:
        cls = apis.request_class(_PRODUCE, client.version_for(_PRODUCE, 11))
        topic_data = item_class(cls, "topic_data")
        partition_data = item_class(topic_data, "partition_data")
        timeout_ms = max(int((deadline - asyncio.get_running_loop().time()) * 1000), 1)
        return build(cls, transactional_id=self.transactional_id, acks=i16(-1),
                     timeout=datetime.timedelta(milliseconds=timeout_ms),
                     topic_data=(topic_data(name=self.topic, partition_data=tuple(
                         partition_data(index=i32(p), records=b) for p, b in batches.items())),))

    # -- failure aftermath -------------------------------------------------------------------------------------------
    def _become_fenced(self, error: KafkaError | None, fenced_writes: Sequence[Queued] = ()) -> None:
        if self._fenced is None:
            log.log(logging.INFO if self.fatal_is_fence else logging.ERROR,
                    "event=state_producer_fenced producer=%s transactional_id=%s error=%s writer=native",
                    self.name, self.transactional_id, error)
        super()._become_fenced(error, fenced_writes)

    async def _reinitialise(self) -> None:
        """InitProducerId with our producer id and epoch, retried for as long as it takes (independently of the
        writes' deadlines: they fail at theirs); refused as fenced: fenced for good."""
        loop = asyncio.get_running_loop()
        attempts = 0
        while not self._closed:
            attempts += 1
            try:
                await self._init_producer_id(loop.time() + _INIT_ATTEMPT_S, fresh=False)
            except _Failed as failed:
                if failed.then == "fenced":
                    self._become_fenced(failed.error)
                    return
                log.info("event=transactions_init_retry producer=%s attempt=%d error=%s writer=native", self.name,
                         attempts, failed.error)
                await asyncio.sleep(_INIT_RETRY_S)
                continue
            self._ready = True
            log.info("event=transactions_reinitialised producer=%s attempts=%d writer=native", self.name, attempts)
            self._wake.set()
            return

    # -- close -----------------------------------------------------------------------------------------------------
    async def close(self, flush_timeout_ms: int = 5_000) -> None:
        """Finish the queued writes (bounded by `flush_timeout_ms`), then close the connections. A transaction
        left open (opened ahead) is committed first; one cut short is aborted by the next holder of the id."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        if self._opening is not None:  # a partition being added ahead: its transaction is committed below
            try:
                await asyncio.wait_for(asyncio.shield(self._opening), flush_timeout_ms / 1000)
            except (asyncio.TimeoutError, Exception):
                pass  # left to the cancellation below (the next holder of the id aborts what is open)
        if self._added and self._committing is None and not self._queue and self._ready:
            self._begin_commit(loop)
        self._closed = True
        self._cancel_open_ahead_expiry()
        self._wake.set()
        if self._worker is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._worker), flush_timeout_ms / 1000)
            except asyncio.TimeoutError:
                self._worker.cancel()
                await asyncio.gather(self._worker, return_exceptions=True)
        for task in (self._committing, self._opening, self._reinit):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._fail_queued(KafkaError(KafkaError._DESTROY, "state producer closed"))
        await self._leaders.close()
