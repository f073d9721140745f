"""The blocking side of a transactional producer: the confluent-kafka client and every call made on it, run on
the producer's serial thread only (serial_thread.py), and what each outcome means (fenced, abort and keep the
producer, or retire it for a fresh one). transactions.py is the loop side that queues writes and decides when."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from coordinator.storage.kafka_logs import kafka_reachable
from coordinator.storage.producer import KafkaRecord, report_offset

log = logging.getLogger("coordinator.storage")
_ABORT_TIMEOUT_S = 0.5  # an abort the broker does not answer this fast: the producer is retired instead

# A newer producer holds our transactional.id: we must not write again.
FENCED_ERRORS = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
# A message that failed inside a transaction makes the commit fail with _INCONSISTENT ("n message(s) failed
# delivery"); the message's own error (e.g. _MSG_TIMED_OUT) is what the request is answered with.
_DELIVERY_SUMMARY = KafkaError._INCONSISTENT
# The broker did not answer: an abort now could only be local, which leaves the producer's sequence numbers
# behind (the next transaction fails OUT_OF_ORDER_SEQUENCE_NUMBER); a fresh producer gets a new epoch instead.
_UNANSWERED = frozenset({KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TIMED_OUT_QUEUE,
                         KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})


class _DeliveryErrors:
    """The first per-message error of a transaction (delivery reports, served while it commits)."""

    __slots__ = ("first",)

    def __init__(self) -> None:
        self.first: KafkaError | None = None

    def on_delivery(self, error: KafkaError | None, _message: object) -> None:
        if error is not None and self.first is None:
            self.first = error

    def reporting_to(self, offsets: list[int] | None) -> Callable[[KafkaError | None, Message | None], None]:
        """The delivery report of a record whose offset is wanted in `offsets`."""
        if offsets is None:
            return self.on_delivery

        def on_delivery(error: KafkaError | None, message: Message | None) -> None:
            self.on_delivery(error, message)
            if error is None:
                report_offset(offsets, message)
        return on_delivery


class TransactionClient:
    """The client of one transactional.id; every method blocks and runs on the producer's serial thread."""

    def __init__(self, topic: str, settings: dict[str, object], name: str, transactional_id: str,
                 fatal_is_fence: bool) -> None:
        self.topic = topic
        self.name = name
        self.transactional_id = transactional_id
        self.fatal_is_fence = fatal_is_fence
        self.settings = settings
        self.producer: Producer | None = None
        self.initialised = False  # its init_transactions returned
        # set once a newer holder of the id fenced this one (here, or by the loop side's re-initialisation)
        self.fenced: KafkaError | None = None
        # a transaction begun ahead of its writes (`open_ahead`), their next `transaction` commits it
        self._open: _DeliveryErrors | None = None

    def init(self, timeout_s: float) -> KafkaError | None:
        """init_transactions on the current producer, or a new one. A timed-out call is resumed by the next
        (librdkafka allows it); a producer that failed otherwise is retired and the next call starts afresh."""
        if self.producer is None:
            self.producer = Producer(self.settings)
            self.initialised = False
            self._open = None
        try:
            self.producer.init_transactions(timeout_s)
            self.initialised = True
            return None
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
        if error.fatal() or not error.retriable():
            self.retire()
        return error

    def transaction(self, records: list[KafkaRecord], timeout_s: float,
                    offsets: Sequence[list[int] | None] | None = None) -> tuple[KafkaError | None, str | None]:
        """One transaction with every record, committed within `timeout_s` or not at all. Returns (error, what
        to do next: None, "abort", "retired" or "fenced"). `offsets[i]`, if given and not None, gets record
        i's offset from its delivery report."""
        if self.fenced is not None:
            return self.fenced, "fenced"
        if self.producer is None:
            return KafkaError(KafkaError._STATE, "no initialised producer"), "retired"
        opened_ahead, self._open = self._open, None
        deliveries = opened_ahead if opened_ahead is not None else _DeliveryErrors()
        # no local reference to the producer: a retired one must be destroyed by its retiring thread alone
        try:
            if opened_ahead is None:
                self.producer.begin_transaction()
            for index, (partition, key, value) in enumerate(records):
                sink = None if offsets is None else offsets[index]
                self.producer.produce(self.topic, value=value, key=key, partition=partition,
                                       on_delivery=deliveries.reporting_to(sink))
            self.producer.commit_transaction(timeout_s)
            kafka_reachable()  # ends an outage's suppressed connection errors with their count
            return None, None
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
        except BufferError:
            error = KafkaError(KafkaError._QUEUE_FULL, "producer queue full")
            return self._failed(error, True)
        if error.code() == KafkaError._FATAL:  # produce() after a fatal error in the background (a fence seen
            error = self._fatal_cause(error)   # by an earlier record's AddPartitionsToTxn): the cause is poll()'s
        elif error.code() == _DELIVERY_SUMMARY:
            self.poll()  # delivery reports not served yet
            if deliveries.first is not None:
                error = KafkaError(deliveries.first.code(), deliveries.first.str(), fatal=error.fatal(),
                                   txn_requires_abort=error.txn_requires_abort())
        return self._failed(error, error.txn_requires_abort())

    def open_ahead(self, records: list[KafkaRecord]) -> bool:
        """Begin a transaction now (if none is open) with `records`, markers that register their partitions with
        the transaction (librdkafka sends AddPartitionsToTxn for a partition once a record is produced to it), so
        the next `transaction`'s commit has two round trips left (Produce, EndTxn) instead of three. Whether
        every marker was produced; a failure is otherwise left to that commit (a marker that did not make it
        changes nothing: its write registers it)."""
        if self.fenced is not None or self.producer is None:
            return False
        try:
            if self._open is None:
                self.producer.begin_transaction()
                self._open = _DeliveryErrors()
            for partition, key, value in records:
                self.producer.produce(self.topic, value=value, key=key, partition=partition,
                                      on_delivery=self._open.on_delivery)
        except (KafkaException, BufferError) as exc:
            log.debug("event=transaction_open_ahead_failed producer=%s error=%s", self.name, exc)
            return False
        return True

    def _fatal_cause(self, refused: KafkaError) -> KafkaError:
        """The producer refuses calls with _FATAL (not itself flagged fatal) once it has hit a fatal error; poll()
        raises that error: a fence (PRODUCER_FENCED / _FENCED) or another fatal one. Either way fatal."""
        cause = self.poll()
        if cause is not None and cause.fatal():
            return cause
        return KafkaError(KafkaError._FATAL, refused.str(), fatal=True)

    def poll(self) -> KafkaError | None:
        """Serve callbacks; a fatal error of the producer is raised by poll(): returned here instead."""
        if self.producer is None:
            return None
        try:
            self.producer.poll(0)
        except KafkaException as exc:
            return exc.args[0] if isinstance(exc.args[0], KafkaError) else None
        return None

    def _failed(self, error: KafkaError, abortable: bool) -> tuple[KafkaError, str]:
        fenced = error.code() in FENCED_ERRORS or (error.fatal() and self.fatal_is_fence)
        if not fenced:
            log.warning("event=transaction_failed producer=%s error=%s fatal=%s", self.name, error, error.fatal())
        else:
            # A partition's producer is fenced when the partition moves: the owner of the store says so once, with
            # what it does next (cluster/ownership.py). Any other producer fenced means a second writer with our
            # transactional.id, which only an operator can resolve.
            log.log(logging.INFO if self.fatal_is_fence else logging.ERROR,
                    "event=state_producer_fenced producer=%s transactional_id=%s error=%s", self.name,
                    self.transactional_id, error)
            self.fenced = KafkaError(KafkaError._FENCED, f"fenced: {error.str()}")
            self.retire()
            return self.fenced, "fenced"
        if abortable and not error.fatal() and error.code() not in _UNANSWERED:
            return error, "abort"  # the broker answers: aborted (next, after the writes are told) and kept
        # Fatal, or the outcome unknown (the broker does not answer): never wait for this producer again.
        self.retire()
        return error, "retired"

    def abort(self) -> str | None:
        self._open = None
        if self.producer is None:
            return "retired"
        try:
            self.producer.abort_transaction(_ABORT_TIMEOUT_S)
            return None
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
        log.warning("event=transaction_abort_failed producer=%s error=%s", self.name, error)
        if error.code() in FENCED_ERRORS or (error.fatal() and self.fatal_is_fence):
            self.fenced = KafkaError(KafkaError._FENCED, f"fenced: {error.str()}")
            self.retire()
            return "fenced"
        self.retire()  # the fresh producer's init_transactions aborts it
        return "retired"

    def retire(self) -> None:
        self._open = None
        if self.producer is not None:
            holder, self.producer = [self.producer], None
            threading.Thread(target=_discard, args=(holder,), name=f"{self.name}-retire", daemon=True).start()

    def destroy(self) -> None:
        producer, self.producer = self.producer, None
        if producer is None:
            return
        if self.initialised:
            _destroy(producer)
        else:  # its init_transactions timed out (broker down): close() would try an abort that conflicts with it
            _discard([producer])


def _destroy(producer: Producer) -> None:
    """On a thread of ours, never by the cyclic GC (which may run on a librdkafka thread)."""
    producer.flush(1.0)
    producer.close()


def _discard(holder: list[Producer]) -> None:
    """A producer given up (fenced, failed, or its transaction's outcome unknown), on a thread of its own: the
    next write must not wait for it. It fails what it still holds, then it is destroyed by dropping its last
    reference here, not by close(): close() first aborts the open transaction, which a fenced producer cannot
    do, a commit left unfinished refuses ("Conflicting commit_transaction API call is already in progress"
    RuntimeWarning) and an unreachable broker makes wait. The newer holder of the id aborts it anyway."""
    holder[0].purge()
    try:
        holder[0].poll(0)
    except KafkaException:  # its fatal error (a fence), known already: nothing more to learn from it
        pass
    holder.clear()
