"""Timestamps of every state write inside `coordinator serve`, for `python -m bench.reconcile_trace` (read its doc).

Loaded by Python's site module when this directory is on PYTHONPATH; it does nothing unless RECONCILE_TRACE names a
file and the process is `coordinator ... serve`. It wraps the steps of a write (the group logic's write made, handed
to the store, queued with the partition's producer, its transaction begun, the transaction's requests, the outcome
on the loop, the runtime's settling, the parked ConsumerGroupHeartbeat answered) with stamps of time.monotonic()
(the clock the bench's own round marks carry), written to that file by a daemon thread every 0.3 s. Both state
writers: librdkafka's (begin/commit_transaction on its serial thread, CONCURRENT_TRANSACTIONS from its `eos` debug
lines) and the native one (AddPartitionsToTxn, Produce, EndTxn and its retries)."""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from typing import Any

_PATH = os.environ.get("RECONCILE_TRACE")
_lines: list[str] = []
_capturing: list[list[int]] = []  # the producer futures made while the runtime hands writes to the store


def stamp(event: str, *detail: object) -> None:
    _lines.append(f"{time.monotonic():.6f} {event} {' '.join(map(str, detail))}\n")


def _write_out() -> None:
    while True:
        time.sleep(0.3)
        if _lines and _PATH:
            taken, _lines[:] = list(_lines), []
            with open(_PATH, "a") as out:
                out.writelines(taken)


def _set(owner: Any, name: str, value: Any) -> None:
    """owner.name = value; a class compiled by mypyc refuses it: said once, that step is not stamped (the storage
    layer's transaction steps are not compiled, the runtime's and the group logic's are: `serve --pure` for those)."""
    try:
        setattr(owner, name, value)
    except (TypeError, AttributeError) as exc:
        print(f"reconcile_trace: {getattr(owner, '__name__', owner)}.{name} not stamped ({exc})", file=sys.stderr)


def _around(owner: Any, name: str, before: Any = None, after: Any = None) -> None:
    """owner.name with `before(self, *args)` and `after(self, result, *args)` around each call."""
    original = getattr(owner, name, None)
    if original is None:
        print(f"reconcile_trace: {owner.__name__}.{name} not found, not stamped", file=sys.stderr)
        return

    @functools.wraps(original)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(self, *args)
        result = original(self, *args, **kwargs)
        if after is not None:
            after(self, result, *args)
        return result
    _set(owner, name, wrapped)


def _around_async(owner: Any, name: str, event: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    async def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        stamp(f"{event}_start", self.name, self.concurrent_transactions_retries)
        try:
            return await original(self, *args, **kwargs)
        finally:
            stamp(f"{event}_end", self.name, self.concurrent_transactions_retries)
    _set(owner, name, wrapped)


class _Refusals(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "concurrent operation" in text or "CONCURRENT_TRANSACTIONS" in text:
            stamp("refused", threading.current_thread().name)


def _install() -> None:
    from confluent_kafka import Producer

    from coordinator.group import runtime
    from coordinator.server import connection
    from coordinator.storage import native_transactions, transaction_client, transaction_queue, transactions

    runtime_class = runtime.GroupRuntime
    from coordinator.group.modern import service
    # a join read by the group logic, and each target batch's settling (the target computed, the batch's write made),
    # with the loop thread's CPU time: wall time beyond it is the thread waiting for a CPU (or the GIL)
    _around(service.ConsumerGroupService, "heartbeat",
            before=lambda self, request: stamp("join_read") if request.member_epoch == 0 else None)
    _around(service.ConsumerGroupService, "_settle_batch",
            before=lambda self, group_id: stamp("batch_start", len(self._batches[group_id].waiting),
                                                f"{time.thread_time():.6f}") if group_id in self._batches else None,
            after=lambda self, result, group_id: stamp("batch_end", f"{time.thread_time():.6f}"))

    def capture_start(self: Any, *_: Any) -> None:
        _capturing.append([])

    def turn_before(self: Any, partition: int) -> None:
        for write in self._in_turn.get(partition, ()):
            stamp("to_store", id(write))
        _capturing.append([])

    def linked(writes: list[Any]) -> None:
        futures = _capturing.pop() if _capturing else []
        stamp("link", ",".join(str(id(w)) for w in writes), ",".join(map(str, futures)))

    def append_before(self: Any, partition: int, write: Any, by_request: bool) -> None:
        stamp("made", id(write))
        stamp("to_store", id(write))
        _capturing.append([])

    _around(runtime_class, "append_in_turn", before=lambda self, partition, write: stamp("made", id(write)))
    send_turn = runtime_class._send_turn

    def _send_turn(self: Any, partition: int) -> None:
        writes = list(self._in_turn.get(partition, ()))
        turn_before(self, partition)
        try:
            send_turn(self, partition)
        finally:
            linked(writes)
    _set(runtime_class, "_send_turn", _send_turn)
    append = runtime_class._append

    def _append(self: Any, partition: int, write: Any, by_request: bool) -> Any:
        append_before(self, partition, write, by_request)
        try:
            return append(self, partition, write, by_request)
        finally:
            linked([write])
    _set(runtime_class, "_append", _append)
    _around(runtime_class, "_settle_all",
            before=lambda self, partition, writes, *rest: stamp("settled", ",".join(str(id(w)) for w in writes)))
    _around(runtime_class, "_after_write",
            after=lambda self, answer, write, response: stamp("answer_future", id(write), id(answer)))
    # a parked answer, written in its done callback or in its write's settling (answer_in_pass)
    _around(connection.Connection, "_answered", before=lambda self, future, in_pass: stamp("responded", id(future)))

    def queued(self: Any, future: Any, records: Any, **_: Any) -> None:
        stamp("queued", self.name, id(future), len(records))
        if _capturing:
            _capturing[-1].append(id(future))
        future.add_done_callback(lambda f: stamp("outcome_callback", id(f)))
    _around(transaction_queue.TransactionQueue, "send", after=queued)

    def begin(self: Any, loop: Any) -> None:
        stamp("begin_commit", self.name, ",".join(str(id(item[1])) for item in self._queue))
    for writer in (transactions.TransactionalProducer, native_transactions.NativeTransactionalProducer):
        _around(writer, "_begin_commit", before=begin)
    _around(transactions.TransactionalProducer, "_answer",
            before=lambda self, batch, result: stamp("answered", self.name, ",".join(str(id(i[1])) for i in batch)))
    native = native_transactions.NativeTransactionalProducer
    _around_async(native, "_add_partitions", "add_partitions")
    _around_async(native, "_produce", "produce")
    _around_async(native, "_end_txn", "end_txn")
    _around_async(native, "_commit", "commit")

    # each delivery report served (librdkafka's dr callback takes the GIL once per record, on the thread that serves
    # it: the serial thread, inside commit_transaction's flush)
    _around(transaction_client._DeliveryErrors, "on_delivery",
            before=lambda self, *_: stamp("dr", threading.current_thread().name))

    class StampedProducer(Producer):  # the client TransactionClient creates
        def begin_transaction(self, *args: Any) -> Any:
            stamp("thread_begin", threading.current_thread().name)
            return super().begin_transaction(*args)

        def commit_transaction(self, *args: Any) -> Any:
            stamp("commit_call", threading.current_thread().name)
            try:
                return super().commit_transaction(*args)
            finally:
                stamp("commit_returned", threading.current_thread().name)
    setattr(transaction_client, "Producer", StampedProducer)
    client_init = transaction_client.TransactionClient.__init__
    refusals = _Refusals(logging.DEBUG)

    def __init__(self: Any, topic: str, settings: dict[str, object], *args: Any, **kwargs: Any) -> None:
        logger = logging.getLogger(f"reconcile_trace.librdkafka.{id(self)}")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.addHandler(refusals)
        # librdkafka's debug lines are log callbacks served on the serial thread, each taking the GIL: RECONCILE_TRACE_EOS=0
        # leaves them out (no refusal count, a trace closer to the untraced server)
        debug = {"debug": "eos"} if os.environ.get("RECONCILE_TRACE_EOS", "1") != "0" else {}
        client_init(self, topic, {**settings, **debug, "logger": logger}, *args, **kwargs)
    setattr(transaction_client.TransactionClient, "__init__", __init__)


if _PATH and "serve" in sys.argv:
    threading.Thread(target=_write_out, name="reconcile-trace", daemon=True).start()
    _install()
