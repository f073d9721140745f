"""Reading the state topic back (Kafka's `doLoadGroupsAndOffsets`, §7.4).

`StateReplay` is the pure part: records in log order, latest wins, a tombstone removes, an unknown key version
is skipped with a warning. `read_state_with_transactions` is the I/O part: it reads every partition from its
earliest offset to its end offset. It blocks, so the store runs it in a worker thread; decoding
happens there too, and the loop receives one finished `LoadedGroups`.

The end offset is the partition's high watermark (ListOffsets read_uncommitted, through the AdminClient), not
the last stable offset: a transaction's commit markers land after `commit_transaction` returns, so right after a
commit the last stable offset can still stop short of it, and a load ending there would miss an acknowledged
write. The records are read read_uncommitted over raw Fetch with our own transaction tracking
(uncommitted_load.py, transaction_log.py): a client transaction open on the partition (its TxnOffsetCommit in our
log) cannot hold the load back, committed transactions are applied at their marker, aborted ones never. Clusters
reached with TLS and SASL are read the same way (coordinator/security/connections.py authenticates our
connections); only a SASL mechanism our client exchange does not speak (OAUTHBEARER through an OIDC token
endpoint) is still read read_committed by librdkafka, which waits below an open transaction (bounded by the load
timeout).
"""

from __future__ import annotations

import logging
import threading
import time

from collections.abc import Callable
from typing import Any

from confluent_kafka import (OFFSET_BEGINNING, Consumer, IsolationLevel, KafkaError, KafkaException, Message,
                             TopicPartition)
from confluent_kafka.admin import AdminClient, OffsetSpec

from coordinator.group.store import LoadedGroups
from coordinator.storage.records import (
    OPEN_AHEAD_KEY_VERSION, GroupMetadataKey, OffsetCommitKey, OffsetRecord, RecordFormatError, UnknownKey,
    decode_group_metadata_value, decode_key, decode_offset_commit_value,
)
from coordinator.group.modern.records import ConsumerGroupRecord
from coordinator.storage.consumer_records import CONSUMER_GROUP_TYPES
from coordinator.storage.consumer_records import decode as decode_consumer_record
from coordinator.timer.clock import Clock
from coordinator.storage.kafka_logs import librdkafka_logger
from coordinator.security.clusters import cluster_security, secured
from coordinator.storage.uncommitted_load import UncommittedLoad, UncommittedLoadError, read_uncommitted, reads_raw
from protocol.errors import ProtocolError
from protocol.fetch_reader import FetchedRecord, FetchError, FetchFormatError

log = logging.getLogger("coordinator.storage")

_BATCH_MESSAGES = 10_000
_POLL_TIMEOUT_S = 0.05  # consume() waits this long unless its batch fills: short, so a small partition loads fast


class LoadError(RuntimeError):
    """The state topic could not be read to its end (broker unreachable, timeout, shutdown)."""


class StateReplay:
    """Applies state-topic records in log order (per partition) and keeps the latest state.

    Group values are the big records (every member, subscription and assignment), and a log that has not
    been compacted holds many generations of each group: they are kept as bytes while replaying and only the
    survivors are decoded, when `state` is read. (So a malformed *latest* group record drops that group, with a
    warning, rather than resurrecting an older generation.)
    """

    def __init__(self) -> None:
        self._state = LoadedGroups()
        self._group_values: dict[str, tuple[bytes, str]] = {}  # group id -> (latest value bytes, position)

    @property
    def state(self) -> LoadedGroups:
        self._decode_groups()
        return self._state

    def apply(self, key_bytes: bytes | None, value_bytes: bytes | None, where: str = "", *,
              log_offset: int | None = None) -> None:
        """`log_offset`: the record's offset in its partition, kept on an offset (`OffsetRecord.log_offset`)."""
        self._state.records += 1
        if key_bytes is None:
            self._malformed(where, "record without a key")
            return
        try:
            key = decode_key(key_bytes)
            if isinstance(key, GroupMetadataKey):
                self._apply_group(key.group, value_bytes, where)
            elif isinstance(key, OffsetCommitKey):
                value = None if value_bytes is None else decode_offset_commit_value(value_bytes)
                if value is not None:
                    value.log_offset = log_offset
                self._apply_offset(key, value)
            elif key.version in CONSUMER_GROUP_TYPES:  # replayed by the consumer groups, in this order
                record = decode_consumer_record(key_bytes, value_bytes)
                if record is not None:
                    self._state.consumer_records.append(record)
            elif key.version != OPEN_AHEAD_KEY_VERSION:  # that one only opened a transaction of ours
                self._unknown(key, where)
        except RecordFormatError as exc:
            self._malformed(where, str(exc))

    def _apply_group(self, group_id: str, value_bytes: bytes | None, where: str) -> None:
        if value_bytes is None:
            self._group_values.pop(group_id, None)
            self._state.groups.pop(group_id, None)
            self._state.classic_read_at.pop(group_id, None)
        else:
            self._group_values[group_id] = (value_bytes, where)
            self._state.classic_read_at[group_id] = len(self._state.consumer_records)

    def _decode_groups(self) -> None:
        for group_id, (value_bytes, where) in self._group_values.items():
            try:
                self._state.groups[group_id] = decode_group_metadata_value(value_bytes)
            except RecordFormatError as exc:
                self._state.groups.pop(group_id, None)
                self._malformed(where, f"group {group_id}: {exc}")
        self._group_values.clear()

    def _apply_offset(self, key: OffsetCommitKey, value: OffsetRecord | None) -> None:
        partition = (key.topic, key.partition)
        if value is not None:
            self._state.offsets.setdefault(key.group, {})[partition] = value
            return
        offsets = self._state.offsets.get(key.group)
        if offsets is not None:
            offsets.pop(partition, None)
            if not offsets:
                del self._state.offsets[key.group]

    def _unknown(self, key: UnknownKey, where: str) -> None:
        self._state.unknown_records += 1
        log.warning("event=state_record_skipped reason=unknown_key_version version=%d at=%s", key.version, where)

    def _malformed(self, where: str, reason: str) -> None:
        self._state.malformed_records += 1
        log.warning("event=state_record_skipped reason=malformed at=%s detail=%s", where, reason)


def consumer_settings(bootstrap: str, client_id: str, buffer_bytes: int) -> dict[str, object]:
    return secured({
        "bootstrap.servers": bootstrap,
        "client.id": f"{client_id}-loader",
        "group.id": f"{client_id}-loader",  # required by librdkafka; only assign() is used, nothing is committed
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",  # aborted and unfinished transactions are never loaded
        "fetch.wait.max.ms": 50,  # the end of a partition is waited for, not data beyond it: answer at once
        "max.partition.fetch.bytes": buffer_bytes,  # Kafka's offsets.load.buffer.size
        "fetch.max.bytes": max(buffer_bytes * 10, 52_428_800),
        "logger": librdkafka_logger("loader"),
    })


def read_state_with_transactions(settings: dict[str, object], topic: str, partitions: list[int], clock: Clock,
                                 timeout_ms: int, stop: threading.Event | None = None,
                                 ends_after: threading.Event | None = None, *,
                                 own_transactional_id_prefix: str | None = None,
                                 ) -> tuple[LoadedGroups, UncommittedLoad | None]:
    """Blocking: replay `partitions` of `topic` from their earliest offset to their high watermark, and what the
    transaction tracking found (uncommitted_load.py): read_uncommitted over raw Fetch, committed transactions
    applied, aborted ones dropped, the clients' open ones returned with where each partition's read ended (None:
    a cluster only librdkafka can authenticate to, read read_committed, see `_read_committed`).

    With `ends_after`, reading starts at once but the high watermarks are taken only once that event is set
    (the store fences the partitions meanwhile: the end must be measured after the fence, the reading need
    not wait for it). `stop` ends the read with LoadError."""
    bootstrap = str(settings["bootstrap.servers"])
    security = cluster_security(bootstrap)
    stop = stop or threading.Event()
    if not reads_raw(security):
        return _read_committed(settings, topic, partitions, clock, timeout_ms, stop, ends_after), None
    deadline_ms = clock.now_ms() + timeout_ms
    replay = StateReplay()

    def apply(partition: int, record: FetchedRecord) -> None:
        replay.apply(record.key, record.value, f"{partition}:{record.offset}", log_offset=record.offset)

    def ours(transactional_id: str) -> bool:
        return own_transactional_id_prefix is not None and transactional_id.startswith(own_transactional_id_prefix)

    try:
        load = read_uncommitted(
            bootstrap, security, topic, partitions, apply,
            lambda: end_offsets(settings, topic, partitions, clock, deadline_ms), is_ours=ours,
            timeout_s=timeout_ms / 1000, stop=stop, max_bytes=int(str(settings["max.partition.fetch.bytes"])),
            ends_after=ends_after)
    except (UncommittedLoadError, FetchError, FetchFormatError, ProtocolError, OSError) as exc:
        raise LoadError(f"state topic {topic!r} not read: {exc}") from exc
    return replay.state, load


def _read_committed(settings: dict[str, object], topic: str, partitions: list[int], clock: Clock,
                    timeout_ms: int, stop: threading.Event, ends_after: threading.Event | None) -> LoadedGroups:
    """The librdkafka read (read_committed, so a client's open transaction holds it at the last stable offset):
    for clusters reached with a SASL mechanism only librdkafka speaks (uncommitted_load.reads_raw)."""
    deadline_ms = clock.now_ms() + timeout_ms
    box = _ConsumerBox(Consumer(settings))
    try:
        box.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        replay = StateReplay()
        if ends_after is not None:
            _read_until(box, topic, replay, {}, lambda: ends_after.is_set(), clock, deadline_ms, stop)
        ends = end_offsets(settings, topic, partitions, clock, deadline_ms)
        pending = {p: end for p, (start, end) in ends.items() if end > start}
        _read_until(box, topic, replay, pending, lambda: not pending, clock, deadline_ms, stop)
        return replay.state
    finally:
        box.close()


class _ConsumerBox:
    """Frames (and the traceback of a failed load) hold this box, never the Consumer itself, so the client is
    destroyed by `close()` on this thread. Left to Python's cyclic GC it could be destroyed on a librdkafka
    thread, which makes librdkafka abort the process (see topics.py)."""

    __slots__ = ("_consumer",)

    def __init__(self, consumer: Consumer) -> None:
        self._consumer: Consumer | None = consumer

    @property
    def consumer(self) -> Consumer:
        assert self._consumer is not None
        return self._consumer

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()


def _read_until(box: _ConsumerBox, topic: str, replay: StateReplay, pending: dict[int, int],
                done: Callable[[], bool], clock: Clock, deadline_ms: int, stop: threading.Event) -> None:
    """Replay what the consumer delivers until `done()`; `pending` (partition → end offset) loses each
    partition whose position reaches its end."""
    _drop_reached(box, topic, pending)  # what was read before the ends were known
    while not done():
        if stop.is_set():
            raise LoadError("loading stopped: the store is closing or the load was abandoned")
        if clock.now_ms() > deadline_ms:
            raise LoadError(f"state topic {topic!r} not read to its end in time; still loading partitions "
                            f"{sorted(pending)} (a transaction still open below their end offsets {pending}?)")
        for message in box.consumer.consume(_BATCH_MESSAGES, _POLL_TIMEOUT_S):
            _take(message, replay, pending)
        _drop_reached(box, topic, pending)


def _drop_reached(box: _ConsumerBox, topic: str, pending: dict[int, int]) -> None:
    """A commit marker moves the position past the last record without a message to show for it."""
    if pending:
        for position in box.consumer.position([TopicPartition(topic, p) for p in pending]):
            end = pending.get(position.partition)
            if end is not None and position.offset >= end:
                del pending[position.partition]


def _take(message: Message, replay: StateReplay, pending: dict[int, int]) -> None:
    error = message.error()
    partition, offset = message.partition(), message.offset()
    if partition is None or offset is None:  # only a client-level error has neither: nothing to place
        log.warning("event=state_read_error error=%s", error)
        return
    if error is None:
        replay.apply(message.key(), message.value(), f"{partition}:{offset}")
        position = offset + 1
    elif error.code() == KafkaError._PARTITION_EOF:
        position = offset
    else:
        log.warning("event=state_read_error partition=%s error=%s", partition, error)
        return
    end = pending.get(partition)
    if end is not None and position >= end:
        del pending[partition]


def end_offsets(settings: dict[str, object], topic: str, partitions: list[int], clock: Clock,
                deadline_ms: int) -> dict[int, tuple[int, int]]:
    """(earliest offset, high watermark) of every partition: ListOffsets read_uncommitted, so the end is not the
    last stable offset (which can lag a committed transaction until its markers land). Retried until the
    deadline while the cluster does not answer."""
    admin_settings: dict[str, Any] = {  # Any: the stubs' str | int | float leaves out the logger it takes
        "bootstrap.servers": settings["bootstrap.servers"],
        "client.id": settings.get("client.id", "group-coordinator-loader"), "logger": librdkafka_logger("loader-admin")}
    box = _AdminBox(AdminClient(secured(admin_settings)))
    try:
        # OffsetSpec's class methods are unannotated in confluent-kafka's stubs
        earliest_spec = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        latest_spec = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        earliest = _list_offsets(box, topic, partitions, earliest_spec, clock, deadline_ms)
        latest = _list_offsets(box, topic, partitions, latest_spec, clock, deadline_ms)
    finally:
        box.release()
    return {p: (earliest[p], latest[p]) for p in partitions}


class _AdminBox:
    """As `_ConsumerBox`: frames and tracebacks hold the box; `release()` drops the client on this thread."""

    __slots__ = ("_admin",)

    def __init__(self, admin: AdminClient) -> None:
        self._admin: AdminClient | None = admin

    @property
    def admin(self) -> AdminClient:
        assert self._admin is not None
        return self._admin

    def release(self) -> None:
        self._admin = None


def _list_offsets(box: _AdminBox, topic: str, partitions: list[int], spec: OffsetSpec, clock: Clock,
                  deadline_ms: int) -> dict[int, int]:
    found: dict[int, int] = {}
    while len(found) < len(partitions):
        wanted = {TopicPartition(topic, p): spec for p in partitions if p not in found}
        timeout_s = max(min(5.0, (deadline_ms - clock.now_ms()) / 1000), 0.5)
        try:
            futures = box.admin.list_offsets(wanted, isolation_level=IsolationLevel.READ_UNCOMMITTED,
                                         request_timeout=timeout_s)
            for tp, future in futures.items():
                found[tp.partition] = future.result(timeout=timeout_s + 1).offset
        except (KafkaException, TimeoutError) as exc:
            if clock.now_ms() > deadline_ms:
                missing = sorted(set(partitions) - set(found))
                raise LoadError(f"end offsets of {topic}{missing} unavailable: {exc}") from None
            log.info("event=state_end_offsets_retry topic=%s error=%s", topic, exc)
            time.sleep(0.2)
    return found
