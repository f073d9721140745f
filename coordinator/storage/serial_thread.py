"""Blocking calls run one after another on one daemon thread of their own, each answered by an asyncio future.

A transactional producer's calls block (init, transactions, aborts, the final destroy); running them on one
thread per producer, in order, means they never overlap (closing a producer while a commit runs on another
thread makes librdkafka refuse the abort) and many producers initialise in parallel instead of queueing for
asyncio's small default executor. The event loop never waits on them."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError

log = logging.getLogger("coordinator.storage")


class SerialThread:
    """Blocking calls run one after another on one daemon thread; each returns an asyncio future. The calls
    return values (errors included), they do not raise: a traceback would hold the frames that hold a client."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, call: Callable[..., Any], *args: Any,
               then: Callable[[Any], None] | None = None) -> asyncio.Future[Any]:
        """`then(result)`, if given, runs on the loop as the result arrives, before the future's own callbacks
        (which come a loop turn later): a waiter answered there is answered one turn sooner."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._calls.put((loop, future, call, args, then))
        return future

    def stop(self) -> None:
        """The thread ends after the calls already submitted."""
        if self._thread is not None:
            self._calls.put(None)

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            loop, future, call, args, then = item
            try:
                result = call(*args)
            except Exception as exc:  # our bug: reported on the loop, the thread goes on
                result = KafkaError(KafkaError._FAIL, f"{call.__name__} failed: {exc!r}")
                log.exception("event=producer_call_crashed thread=%s call=%s", self._name, call.__name__)
            try:
                loop.call_soon_threadsafe(_settle, future, result, then)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass


def _settle(future: asyncio.Future[Any], result: Any, then: Callable[[Any], None] | None) -> None:
    if then is not None:
        try:
            then(result)
        except Exception:  # our bug: the future is still settled, its waiter goes on
            log.exception("event=producer_call_callback_failed")
    if not future.done():
        future.set_result(result)
