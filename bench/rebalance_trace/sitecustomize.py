"""Timestamps of each rebalance inside `coordinator serve`, for `python -m bench.rebalance_trace` (read its doc).

Loaded by Python's site module when this directory is on PYTHONPATH; it does nothing unless REBALANCE_TRACE names a
file and the process is `coordinator ... serve`. It wraps the steps of a rebalance's sync phase with wall-clock
stamps (time.time(), the clock librdkafka's own log lines carry), written to that file by a daemon thread every
0.3 s. REBALANCE_TRACE_DEBUG=eos,protocol,msg also sets librdkafka's `debug` on the state producers (their log goes
to the server's stderr, with its timestamps)."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

_PATH = os.environ.get("REBALANCE_TRACE")
_lines: list[str] = []


def stamp(event: str, detail: object = "") -> None:
    _lines.append(f"{time.time():.6f} {threading.current_thread().name} {event} {detail}\n")


def _write_out() -> None:
    while True:
        time.sleep(0.3)
        if _lines and _PATH:
            taken, _lines[:] = list(_lines), []
            with open(_PATH, "a") as out:
                out.writelines(taken)


def _wrap(owner: Any, name: str, before: str | None = None, after: str | None = None) -> None:
    """owner.name stamped `before` and/or `after` each call; a name that is gone (renamed code) is skipped."""
    original = getattr(owner, name, None)
    if original is None:
        print(f"rebalance_trace: {owner.__name__}.{name} not found, not stamped", file=sys.stderr)
        return

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if before:
            stamp(before)
        result = original(*args, **kwargs)
        if after:
            stamp(after)
        return result
    setattr(owner, name, wrapped)


def _install() -> None:
    from confluent_kafka import Producer

    from coordinator.group import join, rebalance, sync
    from coordinator.server import connection
    from coordinator.storage import transaction_client, transactions

    shard_class: Any = next(c for c in vars(rebalance).values()
                            if isinstance(c, type) and "on_complete_join" in c.__dict__)
    complete_join = shard_class.on_complete_join

    def on_complete_join(self: Any, group: Any) -> None:
        stamp("join_complete_start", group.size)
        complete_join(self, group)
    setattr(shard_class, "on_complete_join", on_complete_join)
    prepare_rebalance = shard_class.prepare_rebalance

    def prepare(self: Any, group: Any, cause: Any) -> None:  # the round's first JoinGroup
        stamp("prepare", group.size)
        prepare_rebalance(self, group, cause)
    setattr(shard_class, "prepare_rebalance", prepare)
    _wrap(sync, "_store_leader_assignment", before="leader_sync")
    _wrap(join, "handle_join_group", before="join_in")  # every request, read and handed to group logic
    _wrap(sync, "handle_sync_group", before="sync_in")
    _wrap(sync, "_on_assignment_stored", before="acked_on_loop")
    _wrap(transactions.TransactionalProducer, "send", before="queued")  # TransactionQueue.send
    _wrap(transactions.TransactionalProducer, "_begin_commit", before="submit")
    _wrap(transactions.TransactionalProducer, "_answer", before="writes_answered")
    _wrap(transaction_client.TransactionClient, "open_ahead", before="open_ahead_call", after="open_ahead_done")
    answered = connection.Connection._answered  # a parked request's answer: in its done callback or in the pass

    def _answered(self: Any, future: Any, in_pass: bool) -> None:
        header = self._in_flight  # the parked request's (cleared by the answer)
        answered(self, future, in_pass)
        if header is not None:
            stamp("answered", int(header.api_key))
    setattr(connection.Connection, "_answered", _answered)
    answer = connection.Connection._answer

    def _answer(self: Any, header: Any, to_frame: Any, future: Any) -> Any:  # parked or answered at once
        response = answer(self, header, to_frame, future)
        stamp("answer_built", int(header.api_key))
        return response
    setattr(connection.Connection, "_answer", _answer)

    class StampedProducer(Producer):  # the client TransactionClient creates
        def begin_transaction(self, *args: Any) -> Any:
            stamp("begin")
            return super().begin_transaction(*args)

        def commit_transaction(self, *args: Any) -> Any:
            stamp("commit_call")
            result = super().commit_transaction(*args)
            stamp("commit_returned")
            return result
    setattr(transaction_client, "Producer", StampedProducer)
    debug = os.environ.get("REBALANCE_TRACE_DEBUG")
    if debug:
        client_init = transaction_client.TransactionClient.__init__

        def __init__(self: Any, topic: str, settings: dict[str, object], *args: Any, **kwargs: Any) -> None:
            settings = {k: v for k, v in settings.items() if k != "logger"}  # librdkafka's stderr log, timestamped
            client_init(self, topic, {**settings, "debug": debug}, *args, **kwargs)
        setattr(transaction_client.TransactionClient, "__init__", __init__)


if _PATH and "serve" in sys.argv:
    threading.Thread(target=_write_out, name="rebalance-trace", daemon=True).start()
    _install()
