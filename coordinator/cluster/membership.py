"""The membership consumer: how Kafka tells this instance which state-topic partitions it owns.

Every instance runs one confluent-kafka `Consumer` in a thread of its own, in the consumer group
"<state topic>.coordinators" (--instances-group), subscribed to the state topic with the cooperative-sticky
assignor. It never consumes: assigned partitions are paused at once. Kafka's group protocol does the rest: a
partition is assigned to exactly one live member, a member that stops heartbeating loses its partitions after
the session timeout, a member that closes cleanly leaves the group and its partitions move at once, and with the
cooperative protocol a rebalance only moves the partitions that change hands (the others keep being served).

The rebalance callbacks run on this thread, inside `poll()`. Each one hands its partitions to the event loop
(`on_assigned`, `on_revoked`, `on_lost` are coroutines run there) and waits for it, bounded: librdkafka tells the
group it gave a partition up only when `on_revoked` returns, so the partition cannot be given to another instance
while this one still serves it.

    loop thread                         membership thread (this module)
    ───────────                         ───────────────────────────────
                                        poll() ─► rebalance callback(partitions)
    on_revoked(partitions) ◄──────────────┤  run_coroutine_threadsafe, wait (bounded)
      unload: NOT_COORDINATOR, ...        │
    done ─────────────────────────────────►  return: librdkafka sends the next JoinGroup/SyncGroup
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from coordinator.security.clusters import secured

log = logging.getLogger("coordinator.cluster")

PartitionsCallback = Callable[[set[int]], Coroutine[Any, Any, None]]
_MAX_HEARTBEAT_INTERVAL_MS = 500
_POLL_INTERVAL_S = 0.1  # how soon a close() is noticed; poll returns at once when a callback is due


def instances_group_for(state_topic: str) -> str:
    """The default consumer group of the instances sharing `state_topic`."""
    return f"{state_topic}.coordinators"


def membership_settings(bootstrap: str, group_id: str, client_id: str, session_timeout_ms: int,
                        max_poll_interval_ms: int) -> dict[str, Any]:
    return secured({
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "client.id": client_id,  # carries our endpoint: the owner map reads it from DescribeGroups (identity.py)
        "partition.assignment.strategy": "cooperative-sticky",
        # dynamic membership (no group.instance.id): a clean stop leaves the group, so its partitions move at once
        "session.timeout.ms": session_timeout_ms,
        # Kafka tells a member of a rebalance in its next heartbeat's answer: the survivors of a departed instance
        # take its partitions only then. At most 500 ms (not Kafka's third of the session: 2 s by default) makes
        # every handover up to 1.5 s shorter, for two heartbeats a second per instance.
        "heartbeat.interval.ms": max(1, min(session_timeout_ms // 3, _MAX_HEARTBEAT_INTERVAL_MS)),
        # also the rebalance timeout: how long a rebalance waits for a member still unloading what it gives up
        "max.poll.interval.ms": max_poll_interval_ms,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "latest",
        "socket.nagle.disable": True,
    })


class Membership:
    """Starts with `start()` (the thread subscribes and polls); `await close()` leaves the group: librdkafka first
    revokes every assigned partition through `on_revoked` (so they are unloaded before anyone else gets them),
    then sends LeaveGroup."""

    def __init__(self, *, bootstrap: str, group_id: str, topic: str, client_id: str, session_timeout_ms: int,
                 on_assigned: PartitionsCallback, on_revoked: PartitionsCallback, on_lost: PartitionsCallback,
                 callback_timeout_ms: int = 60_000, settings: dict[str, Any] | None = None) -> None:
        self.group_id = group_id
        self.topic = topic
        self.callback_timeout_ms = callback_timeout_ms
        # a rebalance must wait for our callbacks longer than we wait for the loop
        max_poll_interval_ms = max(callback_timeout_ms + 30_000, session_timeout_ms)
        self._settings = {**membership_settings(bootstrap, group_id, client_id, session_timeout_ms,
                                                max_poll_interval_ms), **(settings or {})}
        self._callbacks = {"assigned": on_assigned, "revoked": on_revoked, "lost": on_lost}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._consumer: Consumer | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._closed = asyncio.Event()
        self._member_id: str | None = None
        self.assigned: set[int] = set()  # as this thread last learned it (the loop's view is in Ownership)

    @property
    def member_id(self) -> str | None:
        """Our member id in the instances group, as of the last rebalance callback (None before the first)."""
        return self._member_id

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._consumer = Consumer(self._settings, logger=log)
        self._consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_lost)
        self._thread = threading.Thread(target=self._run, name=f"membership-{self.group_id}", daemon=True)
        self._thread.start()
        log.info("event=membership_started group=%s topic=%s client_id=%s session_timeout_ms=%s",
                 self.group_id, self.topic, self._settings["client.id"], self._settings["session.timeout.ms"])

    async def close(self) -> None:
        """Revoke (unloading everything we own) and leave the group; returns when the thread has ended."""
        if self._thread is None:
            return
        self._closing.set()
        await self._closed.wait()
        await asyncio.to_thread(self._thread.join)
        self._thread = None

    # -- the thread -----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        try:
            while not self._closing.is_set():
                try:
                    message = consumer.poll(_POLL_INTERVAL_S)
                except Exception:  # raised by a callback or the client: stay in the group, keep polling
                    log.exception("event=membership_poll_failed group=%s", self.group_id)
                    self._closing.wait(_POLL_INTERVAL_S)
                    continue
                error = None if message is None else message.error()
                if error is not None:
                    self._log_error(error)
        finally:
            try:
                consumer.close()  # revokes what we own (on_revoked, waited for), then LeaveGroup
            except Exception:
                log.exception("event=membership_close_failed group=%s", self.group_id)
            log.info("event=membership_left group=%s member=%s", self.group_id, self._member_id)
            self._notify_closed()

    def _notify_closed(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._closed.set)
            except RuntimeError:  # the loop closed meanwhile
                pass

    def _log_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        log.warning("event=membership_error group=%s error=%s fatal=%s", self.group_id, error.str(), error.fatal())

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        consumer.pause(partitions)  # owned, never consumed
        self._member_id = consumer.memberid()
        numbers = {tp.partition for tp in partitions}
        self.assigned |= numbers
        self._hand_to_loop("assigned", numbers)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = {tp.partition for tp in partitions}
        self._hand_to_loop("revoked", numbers)  # unloaded before librdkafka tells the group
        self.assigned -= numbers
        consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = {tp.partition for tp in partitions}
        self._hand_to_loop("lost", numbers)
        self.assigned -= numbers
        consumer.incremental_unassign(partitions)

    def _hand_to_loop(self, kind: str, partitions: set[int]) -> None:
        log.info("event=membership_%s group=%s member=%s partitions=%s", kind, self.group_id, self._member_id,
                 sorted(partitions))
        if (not partitions and kind != "assigned") or self._loop is None or self._loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self._callbacks[kind](partitions), self._loop)
        try:
            future.result(self.callback_timeout_ms / 1000)
        except concurrent.futures.TimeoutError:
            # The loop is stuck: give the partitions up anyway (the next owner's fencing stops our writes)
            log.error("event=membership_callback_timeout kind=%s partitions=%s timeout_ms=%d", kind,
                      sorted(partitions), self.callback_timeout_ms)
        except Exception:
            log.exception("event=membership_callback_failed kind=%s partitions=%s", kind, sorted(partitions))
