"""A confluent-kafka (librdkafka) producer driven from asyncio without ever blocking the event loop.

Why confluent-kafka rather than aiokafka: librdkafka builds, batches (linger) and sends record batches in C on
its own threads, so the coordinator's one event loop spends a few microseconds per record instead of encoding
batches in Python; its idempotent producer (acks=all, in-order retries) and `message.timeout.ms` give exactly
the "acknowledged or failed within offsets.commit.timeout.ms" contract Kafka's coordinator has.

Threads: `produce_batch()` (one call per write) is a non-blocking enqueue (it raises BufferError when the queue is full instead of waiting),
so it is called on the loop. One daemon thread per producer calls `poll()`, which runs the delivery callbacks;
a `DeliveryBatch` counts the reports of one logical write (a group record, or all partitions of an
OffsetCommit) and hands a single result back with `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Protocol, Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from coordinator.storage.kafka_logs import kafka_reachable, librdkafka_logger

log = logging.getLogger("coordinator.storage")

KafkaRecord = tuple[int, bytes, "bytes | None"]  # (partition, key, value or None for a tombstone)
_POLL_INTERVAL_S = 0.05


class RecordSender(Protocol):
    def send(self, records: Sequence[KafkaRecord], *, offsets: list[int] | None = None
             ) -> asyncio.Future[KafkaError | None]:
        """Queue the records now, after every record sent before (per partition); the future resolves with None
        once they are acknowledged, else with the first error. `offsets` gets each acknowledged record's offset
        (from its delivery report) before the future resolves."""
_SAFETY_MARGIN_MS = 2_000  # librdkafka reports a timeout itself; the sweeper only guards against a lost report


def _as_kafka_error(error: object) -> KafkaError:
    if isinstance(error, KafkaError):
        return error
    return KafkaError(KafkaError._FAIL, f"record not queued: {error}")


def _retire(producer: Producer) -> None:
    """Fail what the broken producer still holds (its delivery reports resolve the waiting writes), then
    destroy it on this thread."""
    producer.purge()
    producer.flush(1.0)
    producer.close()


class _FatalFlag:
    """librdkafka's error callback (poll thread). A fatal error leaves an idempotent producer unusable."""

    __slots__ = ("name", "fatal")

    def __init__(self, name: str) -> None:
        self.name = name
        self.fatal = False

    def on_client_error(self, error: KafkaError) -> None:
        if error.fatal():
            self.fatal = True
            log.error("event=producer_fatal producer=%s error=%s", self.name, error)
        else:
            log.debug("event=producer_error producer=%s error=%s", self.name, error)


class DeliveryBatch:
    """The delivery reports of one logical write, resolved once: None on success, else the first error."""

    __slots__ = ("_loop", "future", "_remaining", "_error", "_lock", "_offsets")

    def __init__(self, loop: asyncio.AbstractEventLoop, expected: int, offsets: list[int] | None = None) -> None:
        self._loop = loop
        self.future: asyncio.Future[KafkaError | None] = loop.create_future()
        self._remaining = expected
        self._error: KafkaError | None = None
        self._lock = threading.Lock()
        self._offsets = offsets  # the acknowledged records' offsets, when the sender wants them

    def on_delivery(self, error: KafkaError | None, message: Message | None) -> None:
        """Runs on the poll thread."""
        if error is None:
            kafka_reachable()
            report_offset(self._offsets, message)
        self.settle(1, error)

    def settle(self, count: int, error: KafkaError | None) -> None:
        """Account for `count` records that ended with `error` (any thread)."""
        with self._lock:
            if error is not None and self._error is None:
                self._error = error
            self._remaining -= count
            done = self._remaining == 0
        if done:
            self._loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if not self.future.done():
            self.future.set_result(self._error)

    def force_resolve(self) -> None:
        """Resolve now with the error recorded so far (the sweeper's last resort; loop thread)."""
        self._resolve()


def report_offset(offsets: list[int] | None, message: Message | None) -> None:
    """An acknowledged record's offset, for a sender that asked for them (list.append is atomic)."""
    if offsets is None or message is None:
        return
    offset = message.offset()
    if offset is not None and offset >= 0:
        offsets.append(offset)


class AsyncProducer:
    """Sends records to one topic; `send` queues them at once and returns their outcome as a future."""

    def __init__(self, topic: str, settings: dict[str, object], name: str) -> None:
        self.topic = topic
        self.name = name
        self._settings = dict(settings)
        self._fatal_flag = _FatalFlag(name)  # the client's callback must not reference self: no cycle
        self._settings["error_cb"] = self._fatal_flag.on_client_error
        self._settings.setdefault("logger", librdkafka_logger(name))
        self._producer = Producer(self._settings)
        self._watched: dict[DeliveryBatch, float] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll_loop, name=f"{name}-poll", daemon=True)
        self._thread.start()

    @property
    def timeout_ms(self) -> int:
        timeout = self._settings.get("message.timeout.ms", 300_000)
        return timeout if isinstance(timeout, int) else int(str(timeout))

    def send(self, records: Sequence[KafkaRecord], *, offsets: list[int] | None = None
             ) -> asyncio.Future[KafkaError | None]:
        """Append `records` now, in order with every earlier send (librdkafka keeps a partition's order); the
        future resolves with None once every one is acknowledged, else with the first error (never raises).
        `offsets` gets the acknowledged records' offsets."""
        batch = DeliveryBatch(asyncio.get_running_loop(), len(records), offsets)
        self._enqueue(records, batch)
        if not batch.future.done():
            self._watch(batch)
        return batch.future

    def open_ahead(self, partition: int, marker: KafkaRecord) -> None:
        """A write to `partition` is expected soon: nothing to prepare, records are appended as they come (a
        transactional writer begins its transaction here: transactions.py)."""

    def _enqueue(self, records: Sequence[KafkaRecord], batch: DeliveryBatch) -> None:
        """One produce_batch call per partition (a write is normally a single group, so a single partition)."""
        if not records:
            batch.settle(0, None)
            return
        self._maybe_replace_fatal_producer()
        by_partition: dict[int, list[dict[str, object]]] = {}
        for partition, key, value in records:
            message: dict[str, object] = {"key": key} if value is None else {"key": key, "value": value}
            by_partition.setdefault(partition, []).append(message)
        for partition, messages in by_partition.items():
            failure: object  # a KafkaError, or what produce_batch put in a refused message's `_error`
            try:
                queued = self._producer.produce_batch(self.topic, messages, partition=partition,
                                                      on_delivery=batch.on_delivery)
            except BufferError:
                queued, failure = 0, KafkaError(KafkaError._QUEUE_FULL, "producer queue full")
            except KafkaException as exc:
                queued, failure = 0, exc.args[0]
            else:
                failure = next((m["_error"] for m in messages if "_error" in m), None)
            if queued < len(messages):  # refused messages get no delivery report: account for them here
                batch.settle(len(messages) - queued, _as_kafka_error(failure))

    def _watch(self, batch: DeliveryBatch) -> None:
        """librdkafka reports every record within message.timeout.ms; the sweeper only guards against a report
        that never comes, with one periodic task instead of a timer per write."""
        loop = batch.future.get_loop()
        self._watched[batch] = loop.time() + (self.timeout_ms + _SAFETY_MARGIN_MS) / 1000
        batch.future.add_done_callback(lambda _: self._watched.pop(batch, None))
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while self._watched:
            await asyncio.sleep(1.0)
            now = loop.time()
            for batch in [b for b, deadline in self._watched.items() if deadline <= now]:
                log.error("event=delivery_report_missing producer=%s", self.name)
                batch.settle(0, KafkaError(KafkaError._MSG_TIMED_OUT, "no delivery report in time"))
                batch.force_resolve()

    def _maybe_replace_fatal_producer(self) -> None:
        """An idempotent producer that hit a fatal error (e.g. lost sequence state) is replaced by a fresh one.
        Its queued records fail with their own delivery reports when it is purged."""
        if not self._fatal_flag.fatal:
            return
        old, self._producer, self._fatal_flag.fatal = self._producer, Producer(self._settings), False
        threading.Thread(target=_retire, args=(old,), name=f"{self.name}-retire", daemon=True).start()
        log.warning("event=producer_replaced producer=%s reason=fatal_error", self.name)

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(_POLL_INTERVAL_S)

    async def flush(self, timeout_ms: int) -> int:
        """Wait (in a worker thread) until everything enqueued is delivered or failed; returns how many remain."""
        return await asyncio.to_thread(self._producer.flush, timeout_ms / 1000)

    async def close(self, flush_timeout_ms: int = 5_000) -> None:
        """Stop polling, deliver (or fail) what is queued, and destroy the client — all in a worker thread."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._stop.set()
        await asyncio.to_thread(self._close_blocking, flush_timeout_ms)

    def _close_blocking(self, flush_timeout_ms: int) -> None:
        self._thread.join()
        remaining = self._producer.flush(flush_timeout_ms / 1000)
        if remaining:
            log.warning("event=producer_closed_with_undelivered producer=%s records=%d", self.name, remaining)
            self._producer.purge()
            self._producer.flush(0)
        # Destroyed here, on a thread of ours, never by the cyclic GC (which may run on a librdkafka thread).
        self._producer.close()
        self._producer = None  # type: ignore[assignment]
