"""The state topic read read_uncommitted with our own transaction tracking (transaction_log.py), over raw Fetch
(protocol/fetch_reader.py): a client's transaction left open on a partition holds its last stable offset, which a
read_committed load cannot pass; this load reads to the high watermark whatever is open, applies what is
committed, drops what is aborted, and returns the clients' open transactions as pending.

Blocking like loader.read_state (it runs its own event loop in the store's worker thread): one connection to
each partition leader, found with Metadata.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from kio.static.primitive import i64

from coordinator.security.clusters import ClusterSecurity
from coordinator.storage.transaction_log import PendingClientTransaction, TransactionTracker, read_to
from protocol import apis
from protocol.client import KafkaClient
from protocol.fetch_reader import FetchedRecord, tolerant_request
from protocol.messages import build, item_class

_METADATA, _LIST_TRANSACTIONS = 3, 66
_RETRY_S = 0.2


class UncommittedLoadError(RuntimeError):
    pass


@dataclass
class UncommittedLoad:
    """What a load found besides the replayed state: the clients' open transactions per partition, the
    positions reached (where a tail starts), and counts for the load's log line."""
    pending: dict[int, list[PendingClientTransaction]] = field(default_factory=dict)
    positions: dict[int, int] = field(default_factory=dict)
    committed_batches: int = 0
    aborted_batches: int = 0


def read_uncommitted(bootstrap: str, security: ClusterSecurity | None, topic: str, partitions: list[int],
                     apply: Callable[[int, FetchedRecord], None], ends: Callable[[], dict[int, tuple[int, int]]],
                     *, is_ours: Callable[[str], bool], timeout_s: float, stop: threading.Event,
                     max_bytes: int, ends_after: threading.Event | None = None) -> UncommittedLoad:
    """Blocking: replay `partitions` from their earliest offset to the end `ends()` gives ((earliest, high
    watermark) per partition, called once `ends_after` is set). `apply(partition, record)` gets every
    committed or non-transactional record in log order. `is_ours(transactional_id)` names our writers, whose
    open batches are dropped rather than returned as pending."""
    return asyncio.run(_read(bootstrap, security, topic, partitions, apply, ends, is_ours, timeout_s, stop,
                             max_bytes, ends_after))


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

    clients: dict[tuple[str, int], KafkaClient] = {}
    try:
        bootstrap_client = await _connect(clients, *_host_port(bootstrap), security)
        leaders, brokers = await _leaders(bootstrap_client, topic, partitions, past_deadline)
        trackers = {p: TransactionTracker(_applier(apply, p)) for p in partitions}
        if ends_after is not None:  # the ends are measured after the store's fence: wait (in this thread's loop)
            while not ends_after.is_set():
                if past_deadline():
                    raise UncommittedLoadError("the store's fence did not finish in time")
                await asyncio.sleep(0.01)
        result = UncommittedLoad()
        for address in set(leaders.values()):
            await _connect(clients, *address, security)

        async def read_partition(partition: int, start: int, end: int) -> None:
            client = await _connect(clients, *leaders[partition], security)
            result.positions[partition] = await read_to(client, topic, partition, start, end, trackers[partition],
                                                        max_bytes=max_bytes, deadline=past_deadline)

        try:  # the partitions side by side: their fetches pipeline on each leader's connection
            await asyncio.gather(*(read_partition(p, start, end)
                                   for p, (start, end) in (await asyncio.to_thread(ends)).items()))
        except TimeoutError as exc:
            raise UncommittedLoadError(f"state topic {topic!r} not read to its end in time: {exc}") from None
        open_producers = set().union(*(t.open_producers() for t in trackers.values()))
        ours = await _our_producer_ids(clients, brokers, open_producers, is_ours, security) if open_producers else set()
        for partition, tracker in trackers.items():
            result.committed_batches += tracker.committed_batches
            result.aborted_batches += tracker.aborted_batches
            pending = tracker.finish(ours)
            if pending:
                result.pending[partition] = pending
        return result
    finally:
        for client in clients.values():
            await client.close()


def _applier(apply: Callable[[int, FetchedRecord], None], partition: int) -> Callable[[FetchedRecord], None]:
    return lambda record: apply(partition, record)


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.split(",")[0].strip().rsplit(":", 1)
    return host, int(port)


async def _connect(clients: dict[tuple[str, int], KafkaClient], host: str, port: int,
                   security: ClusterSecurity | None) -> KafkaClient:
    client = clients.get((host, port))
    if client is None or client.is_closed:
        client = await KafkaClient.connect(host, port, client_id="group-coordinator-loader",
                                           ssl=security.ssl_context if security else None)
        clients[(host, port)] = client
    return client


async def _leaders(client: KafkaClient, topic: str, partitions: list[int], past_deadline: Callable[[], bool],
                   ) -> tuple[dict[int, tuple[str, int]], list[tuple[str, int]]]:
    """(partition → leader address, every broker's address), asked until every partition has a leader."""
    topic_class = item_class(apis.request_class(_METADATA, 12), "topics")
    while True:
        answer = await tolerant_request(client, build(apis.request_class(_METADATA, 12), topics=(
            build(topic_class, name=topic, topic_id=None),), allow_auto_topic_creation=False,
            include_topic_authorized_operations=False))
        brokers = {int(b.node_id): (str(b.host), int(b.port)) for b in answer.brokers}
        leaders = {int(p.partition_index): brokers.get(int(p.leader_id))
                   for t in answer.topics if t.name == topic and t.error_code == 0 for p in t.partitions}
        found = {p: leaders[p] for p in partitions if leaders.get(p) is not None}
        if len(found) == len(partitions):
            return found, list(brokers.values())  # type: ignore[return-value]  # None filtered above
        if past_deadline():
            raise UncommittedLoadError(f"no leader for {topic}{sorted(set(partitions) - set(found))} in time")
        await asyncio.sleep(_RETRY_S)


async def _our_producer_ids(clients: dict[tuple[str, int], KafkaClient], brokers: list[tuple[str, int]],
                            producer_ids: set[int], is_ours: Callable[[str], bool],
                            security: ClusterSecurity | None) -> set[int]:
    """Which of the open producer ids are our writers': ListTransactions on every broker (each lists the
    transactions its transaction coordinator partitions hold) names their transactional ids."""
    ours = set()
    for host, port in brokers:
        client = await _connect(clients, host, port, security)
        answer = await tolerant_request(client, build(apis.request_class(_LIST_TRANSACTIONS, 0), state_filters=(),
                                                      producer_id_filters=tuple(i64(p) for p in producer_ids)))
        ours |= {int(s.producer_id) for s in answer.transaction_states if is_ours(str(s.transactional_id))}
    return ours
