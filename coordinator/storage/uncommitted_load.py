"""The state topic read read_uncommitted with our own transaction tracking (transaction_log.py), over raw Fetch
(protocol/fetch_reader.py): a client's transaction left open on a partition holds its last stable offset, which a
read_committed load cannot pass; this load reads to the high watermark whatever is open, applies what is
committed, drops what is aborted, and returns the clients' open transactions as pending.

Blocking like loader.read_state_with_transactions, which runs it (its own event loop in the store's worker
thread): one connection to each partition leader, found with Metadata and found again when a fetch meets a
leadership change or a lost connection (retried until the load's deadline, as librdkafka does).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from kio.static.primitive import i64

from coordinator.security.clusters import ClusterSecurity
from coordinator.security.connections import connect as connect_to_cluster
from coordinator.security.sasl_client import supports as sasl_supported
from coordinator.storage.transaction_log import FetchAt, PendingClientTransaction, TransactionTracker, read_to
from protocol import apis
from protocol.client import DEFAULT_TIMEOUT_MS, KafkaClient
from protocol.errors import ProtocolError
from protocol.fetch_reader import FetchedBatch, FetchedPartition, FetchedRecord, FetchError, fetch, tolerant_request
from protocol.messages import build, item_class

_METADATA, _LIST_TRANSACTIONS = 3, 66
_OFFSET_OUT_OF_RANGE = 1
# leadership moving or not yet known, a replica or log dir briefly unavailable: ask again after new metadata
RETRIABLE_FETCH_ERRORS = {3, 5, 6, 9, 56, 74, 75}  # UNKNOWN_TOPIC_OR_PARTITION ... UNKNOWN_LEADER_EPOCH
_RETRY_S = 0.2
# a transaction's outcome is decided in these states (Kafka's TransactionState names), its markers on their way
_DECIDED = {"PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "PrepareEpochFence"}


class UncommittedLoadError(RuntimeError):
    pass


@dataclass
class UncommittedLoad:
    """What a load found besides the replayed state: the clients' open transactions per partition, the
    positions reached (where a tail starts), and counts for the load's log line."""
    pending: dict[int, list[PendingClientTransaction]] = field(default_factory=dict)
    # the last batch of each client producer with nothing open, per partition (TransactionTracker.settled_sequences)
    settled: dict[int, list[FetchedBatch]] = field(default_factory=dict)
    positions: dict[int, int] = field(default_factory=dict)
    committed_batches: int = 0
    aborted_batches: int = 0


def read_uncommitted(bootstrap: str, security: ClusterSecurity | None, topic: str, partitions: list[int],
                     apply: Callable[[int, FetchedRecord], None], ends: Callable[[], dict[int, tuple[int, int]]],
                     *, is_ours: Callable[[str], bool], timeout_s: float, stop: threading.Event,
                     max_bytes: int, ends_after: threading.Event | None = None) -> UncommittedLoad:
    """Blocking: replay `partitions` from their earliest offset to the end `ends()` gives ((earliest, high
    watermark) per partition, called once `ends_after` is set; what is there is read meanwhile).
    `apply(partition, record)` gets every committed or non-transactional record in log order.
    `is_ours(transactional_id)` names our writers, whose open batches are dropped rather than returned."""
    return asyncio.run(_read(bootstrap, security, topic, partitions, apply, ends, is_ours, timeout_s, stop,
                             max_bytes, ends_after))


def reads_raw(security: ClusterSecurity | None) -> bool:
    """Whether our own connections (TLS, then SASL with the mechanisms sasl_client.py speaks) can read the
    cluster; else only librdkafka can (OAUTHBEARER through an OIDC token endpoint)."""
    return security is None or not security.client.uses_sasl or sasl_supported(security.client)


class PartitionLeaders:
    """Connections to the partitions' leaders, and fetches that survive a leadership change."""

    def __init__(self, bootstrap: str, security: ClusterSecurity | None, topic: str, max_bytes: int,
                 past_deadline: Callable[[], bool], *, client_id: str = "group-coordinator-loader",
                 reauthenticate: bool = False) -> None:
        self.bootstrap = _host_port(bootstrap)
        self.client_id = client_id
        # connections kept for long and written on (the native state writer): re-authenticated before the broker's
        # SASL session on them ends (KIP-368), else the broker closes one under a request
        self.reauthenticate = reauthenticate
        self.security = security
        self.topic = topic
        self.max_bytes = max_bytes
        self.past_deadline = past_deadline
        self.clients: dict[tuple[str, int], KafkaClient] = {}
        self._connecting: dict[tuple[str, int], asyncio.Lock] = {}
        self.leaders: dict[int, tuple[str, int]] = {}
        self.brokers: list[tuple[str, int]] = []

    async def connect(self, address: tuple[str, int]) -> KafkaClient:
        # partitions read side by side ask for the same leader at once: one connection each, made once (a second
        # one made meanwhile would replace the first in `clients`, which would then never be closed)
        async with self._connecting.setdefault(address, asyncio.Lock()):
            client = self.clients.get(address)
            if client is None or client.is_closed:
                client = await connect_to_cluster(*address, self.security, client_id=self.client_id,
                                                  timeout_ms=DEFAULT_TIMEOUT_MS, reauthenticate=self.reauthenticate)
                self.clients[address] = client
            return client

    async def refresh(self, partitions: list[int]) -> None:
        """Ask Metadata (any broker we know) until every partition has a leader."""
        request_class = apis.request_class(_METADATA, 12)
        request = build(request_class, topics=(build(item_class(request_class, "topics"), name=self.topic,
                                                     topic_id=None),),
                        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        while True:
            try:
                answer = await tolerant_request(await self.connect(self.bootstrap), request)
                brokers = {int(b.node_id): (str(b.host), int(b.port)) for b in answer.brokers}
                for answered in answer.topics:
                    if answered.name == self.topic and answered.error_code == 0:
                        for p in answered.partitions:
                            if int(p.leader_id) in brokers:
                                self.leaders[int(p.partition_index)] = brokers[int(p.leader_id)]
                self.brokers = list(brokers.values())
                if all(p in self.leaders for p in partitions):
                    return
            except (ProtocolError, OSError):
                pass  # the bootstrap broker is restarting: ask again
            if self.past_deadline():
                raise UncommittedLoadError(f"no leader for {self.topic}{sorted(partitions)} in time")
            await asyncio.sleep(_RETRY_S)

    def fetcher(self, partition: int) -> FetchAt:
        async def fetch_at(position: int) -> FetchedPartition:
            return await self.fetch(partition, position)
        return fetch_at

    async def fetch(self, partition: int, position: int, *, max_wait_ms: int = 0) -> FetchedPartition:
        while True:
            if self.past_deadline():
                raise UncommittedLoadError(f"{self.topic}-{partition} not read to its end in time (at {position})")
            try:
                client = await self.connect(self.leaders[partition])
                return await fetch(client, self.topic, partition, position, max_bytes=self.max_bytes,
                                   max_wait_ms=max_wait_ms, timeout_ms=30_000)
            except FetchError as exc:
                if exc.error_code not in RETRIABLE_FETCH_ERRORS:
                    raise
            except (ProtocolError, OSError):
                pass  # connection lost or timed out: the leader may have moved
            await asyncio.sleep(_RETRY_S)
            await self.refresh([partition])

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()


async def _read(bootstrap: str, security: ClusterSecurity | None, topic: str, partitions: list[int],
                apply: Callable[[int, FetchedRecord], None], ends: Callable[[], dict[int, tuple[int, int]]],
                is_ours: Callable[[str], bool], timeout_s: float, stop: threading.Event, max_bytes: int,
                ends_after: threading.Event | None) -> UncommittedLoad:
    loop = asyncio.get_running_loop()
    deadline_at = loop.time() + timeout_s

    def past_deadline() -> bool:
        if stop.is_set():
            raise UncommittedLoadError("loading stopped: the store is closing or the load was abandoned")
        return loop.time() > deadline_at

    leaders = PartitionLeaders(bootstrap, security, topic, max_bytes, past_deadline)
    try:
        await leaders.refresh(partitions)
        trackers = {p: TransactionTracker(_applier(apply, p)) for p in partitions}
        read_before: dict[int, int] = {}
        if ends_after is not None:  # the ends are measured after the store's fence: read what is there meanwhile
            async def read_while_fencing(partition: int) -> None:
                read_before[partition] = await _read_until_set(leaders, partition, trackers[partition], ends_after)

            await asyncio.gather(*(read_while_fencing(p) for p in partitions))
        result = UncommittedLoad()

        async def read_partition(partition: int, start: int, end: int) -> None:
            start = max(start, read_before.get(partition, start))
            result.positions[partition] = await read_to(leaders.fetcher(partition), start, end, trackers[partition])

        try:  # the partitions side by side: their fetches pipeline on each leader's connection
            await asyncio.gather(*(read_partition(p, start, end)
                                   for p, (start, end) in (await asyncio.to_thread(ends)).items()))
        except TimeoutError as exc:
            raise UncommittedLoadError(f"state topic {topic!r} not read to its end: {exc}") from None
        ours = await _settle_decided(leaders, trackers, result.positions, is_ours)
        for partition, tracker in trackers.items():
            result.committed_batches += tracker.committed_batches
            result.aborted_batches += tracker.aborted_batches
            result.settled[partition] = tracker.settled_sequences(ours)
            pending = tracker.finish(ours)
            if pending:
                result.pending[partition] = pending
        return result
    finally:
        await leaders.close()


async def _read_until_set(leaders: PartitionLeaders, partition: int, tracker: TransactionTracker,
                          done: threading.Event) -> int:
    """Feed the partition from offset 0 until it is caught up or `done` is set, then wait for `done`; the
    position reached (0 when the log no longer starts at 0: the read after `done` starts at its earliest)."""
    position = 0
    caught_up = False
    while not done.is_set():
        if leaders.past_deadline():
            raise UncommittedLoadError("the store's fence did not finish in time")
        if caught_up:
            await asyncio.sleep(0.01)
            continue
        try:
            answer = await leaders.fetch(partition, position)
        except FetchError as exc:
            if exc.error_code != _OFFSET_OUT_OF_RANGE or position != 0:
                raise
            caught_up = True
            continue
        for batch in answer.batches:
            tracker.feed(batch)
        caught_up = answer.next_offset == position or answer.next_offset >= answer.high_watermark
        position = answer.next_offset
    return position


def _applier(apply: Callable[[int, FetchedRecord], None], partition: int) -> Callable[[FetchedRecord], None]:
    return lambda record: apply(partition, record)


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.split(",")[0].strip().rsplit(":", 1)
    return host, int(port)


async def _settle_decided(leaders: PartitionLeaders, trackers: dict[int, TransactionTracker], positions: dict[int, int],
                          is_ours: Callable[[str], bool]) -> set[int]:
    """The transactions still open at the end: those the transaction coordinator has decided (their markers
    are on the way: EndTxn answers before they land) are read on until their marker, as a read_committed load
    waits for them; an ongoing one stays open (a client's becomes pending; ours is dropped: the load's fence
    aborts it). Our producer ids."""
    open_producers = set().union(*(t.open_producers() for t in trackers.values()))
    if not open_producers:
        return set()
    states = await transaction_states(leaders, open_producers)
    ours = {pid for pid, (transactional_id, _state) in states.items() if is_ours(transactional_id)}
    awaited = {pid for pid, (_id, state) in states.items() if state in _DECIDED}
    for partition, tracker in trackers.items():
        while tracker.open_producers() & awaited:
            answer = await leaders.fetch(partition, positions[partition], max_wait_ms=100)
            for batch in answer.batches:
                tracker.feed(batch)
            positions[partition] = answer.next_offset
    return ours


async def transaction_states(leaders: PartitionLeaders, producer_ids: set[int], *, complete: bool = False
                             ) -> dict[int, tuple[str, str]]:
    """producer id → (transactional id, state): ListTransactions on every broker (each lists the transactions
    its transaction coordinator partitions hold). With `complete`, a broker answering an error (its
    transaction coordinator still loading) raises FetchError rather than leaving its transactions out."""
    request = build(apis.request_class(_LIST_TRANSACTIONS, 0), state_filters=(),
                    producer_id_filters=tuple(i64(p) for p in producer_ids))
    states = {}
    for address in leaders.brokers:
        answer = await tolerant_request(await leaders.connect(address), request)
        if complete and int(answer.error_code) != 0:
            raise FetchError(int(answer.error_code), f"ListTransactions on {address}: error {int(answer.error_code)}")
        states.update({int(s.producer_id): (str(s.transactional_id), str(s.transaction_state))
                       for s in answer.transaction_states})
    return states
