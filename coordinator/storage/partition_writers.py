"""Routing a state partition's records to the transactional producer that owns it (transactions.py).

One producer has one transaction in flight at a time, so `TransactionalWriters` keeps a few, each owning a
fixed share of the partitions (partition % count): transactions of different shares run in parallel, and a
partition's writes stay in order because they always go through the same producer's queue. With several
instances, `PartitionTransactions` keeps one producer per owned partition, whose transactional.id fences the
partition's previous owner.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence

from confluent_kafka import KafkaError

from coordinator.security.clusters import cluster_security
from coordinator.storage.native_transactions import NativeTransactionalProducer
from coordinator.storage.producer import KafkaRecord
from coordinator.storage.transactions import TransactionalProducer as LibrdkafkaTransactionalProducer
from coordinator.storage.uncommitted_load import reads_raw

log = logging.getLogger("coordinator.storage")

# Either writer (StorageConfig.state_writer): the same surface, the same transactional ids.
TransactionalProducer = LibrdkafkaTransactionalProducer | NativeTransactionalProducer


def transactional_producer(state_writer: str, topic: str, settings: dict[str, object], name: str,
                           transactional_id: str, timeout_ms: int, on_fenced: Callable[[], None] | None = None,
                           fatal_is_fence: bool = False, markers_settle_ms: float = 0.0) -> TransactionalProducer:
    """The transactional producer of `state_writer`: "librdkafka" (transactions.py) or "native"
    (native_transactions.py). The native one connects as the txn tails do (TLS, SASL as sasl_client.py speaks
    it); a cluster only librdkafka can reach (OAUTHBEARER through an OIDC token endpoint) keeps librdkafka's."""
    native = state_writer == "native"
    if native and not reads_raw(cluster_security(str(settings.get("bootstrap.servers", "")))):
        log.warning("event=state_writer_fallback producer=%s detail=the cluster's SASL mechanism is one only "
                    "librdkafka speaks: the librdkafka writer is used", name)
        native = False
    if native:  # it sends AddPartitionsToTxn again after 1 ms itself
        return NativeTransactionalProducer(topic, settings, name, transactional_id, timeout_ms, on_fenced=on_fenced,
                                           fatal_is_fence=fatal_is_fence)
    return LibrdkafkaTransactionalProducer(topic, settings, name, transactional_id, timeout_ms, on_fenced=on_fenced,
                                           fatal_is_fence=fatal_is_fence, markers_settle_ms=markers_settle_ms)


class _RoutedWriters:
    """Sends each record through the transactional producer that owns its partition. A send spanning
    partitions (tombstone retries) is split by producer and resolves with the first error."""

    topic: str

    def _route(self, partition: int) -> TransactionalProducer | None:
        raise NotImplementedError

    def _producers(self) -> list[TransactionalProducer]:
        raise NotImplementedError

    @property
    def transactions(self) -> int:
        return sum(p.transactions for p in self._producers())

    def send(self, records: Sequence[KafkaRecord], *, offsets: list[int] | None = None
             ) -> asyncio.Future[KafkaError | None]:
        """Queue each share with its producer now (a partition's records stay in the order they were sent);
        `offsets` gets the acknowledged records' offsets."""
        shares: dict[TransactionalProducer | None, list[KafkaRecord]] = {}
        for record in records:
            shares.setdefault(self._route(record[0]), []).append(record)
        sends = [_not_owned(share) if producer is None else producer.send(share, offsets=offsets)
                 for producer, share in shares.items()]
        if len(sends) == 1:
            return sends[0]
        outcome: asyncio.Future[KafkaError | None] = asyncio.get_running_loop().create_future()
        if not sends:
            outcome.set_result(None)
            return outcome
        gathered = asyncio.gather(*sends)
        gathered.add_done_callback(
            lambda done: outcome.set_result(next((e for e in done.result() if e is not None), None)))
        return outcome

    def open_ahead(self, partition: int, marker: KafkaRecord) -> None:
        """A write to `partition` is expected soon: its producer's transaction may begin now (transactions.py)."""
        producer = self._route(partition)
        if producer is not None:
            producer.open_ahead(partition, marker)

    async def flush(self, timeout_ms: int) -> int:
        remaining = await asyncio.gather(*(p.flush(timeout_ms) for p in self._producers()))
        return sum(remaining)

    async def close(self, flush_timeout_ms: int = 5_000) -> None:
        await asyncio.gather(*(p.close(flush_timeout_ms) for p in self._producers()))


def _not_owned(records: Sequence[KafkaRecord]) -> asyncio.Future[KafkaError | None]:
    partitions = sorted({partition for partition, _, _ in records})
    refused: asyncio.Future[KafkaError | None] = asyncio.get_running_loop().create_future()
    refused.set_result(KafkaError(KafkaError.NOT_COORDINATOR, f"partitions {partitions} are not loaded here"))
    return refused


class TransactionalWriters(_RoutedWriters):
    """`count` transactional producers (ids `<transactional_id>-<k>`), partition p written by producer p % count
    (one instance owning every partition)."""

    def __init__(self, topic: str, settings: dict[str, object], name: str, transactional_id: str,
                 timeout_ms: int, count: int, state_writer: str = "librdkafka", markers_settle_ms: float = 0.0
                 ) -> None:
        self.topic = topic
        self.name = name
        self.timeout_ms = timeout_ms
        self.producers = [transactional_producer(state_writer, topic, settings, f"{name}-{k}",
                                                 f"{transactional_id}-{k}", timeout_ms,
                                                 markers_settle_ms=markers_settle_ms) for k in range(count)]

    def _route(self, partition: int) -> TransactionalProducer:
        return self.producers[partition % len(self.producers)]

    def _producers(self) -> list[TransactionalProducer]:
        return self.producers

    async def start(self, timeout_ms: int = 60_000) -> None:
        await asyncio.gather(*(p.start(timeout_ms) for p in self.producers))


class PartitionTransactions(_RoutedWriters):
    """One transactional producer per owned partition, `transactional.id = <transactional_id>-p<partition>`
    (several instances sharing one state topic). `acquire` fences the partitions' previous owner: its
    init_transactions aborts the transaction that owner left open, and that owner's later writes fail.
    Writes to a partition not acquired fail NOT_COORDINATOR. `on_fenced(partition)` runs on the loop once when
    a partition's producer is fenced by a newer owner."""

    def __init__(self, topic: str, settings: dict[str, object], name: str, transactional_id: str,
                 timeout_ms: int, on_fenced: Callable[[int], None], state_writer: str = "librdkafka",
                 markers_settle_ms: float = 0.0) -> None:
        self.topic = topic
        self.state_writer = state_writer
        self.markers_settle_ms = markers_settle_ms
        self.name = name
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self._settings = settings
        self._on_fenced = on_fenced
        self._owned: dict[int, TransactionalProducer] = {}

    def _route(self, partition: int) -> TransactionalProducer | None:
        return self._owned.get(partition)

    def _producers(self) -> list[TransactionalProducer]:
        return list(self._owned.values())

    def owns(self, partition: int) -> bool:
        producer = self._owned.get(partition)
        return producer is not None and not producer.fenced

    def transactional_id_of(self, partition: int) -> str:
        return f"{self.transactional_id}-p{partition}"

    async def acquire(self, partitions: Collection[int], timeout_ms: int) -> None:
        """Fence the partitions (in parallel; those already held and not fenced are kept). Raises the first
        failure (KafkaException: the cluster did not answer within `timeout_ms`) after the others finished;
        the partitions that succeeded stay acquired."""
        started = [self._acquire_one(p, timeout_ms) for p in sorted(set(partitions)) if not self.owns(p)]
        outcomes = await asyncio.gather(*started, return_exceptions=True)
        failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failure is not None:
            raise failure

    async def _acquire_one(self, partition: int, timeout_ms: int) -> None:
        old = self._owned.pop(partition, None)
        if old is not None:  # fenced earlier: a fresh producer takes the partition back
            await old.close(0)
        producer = transactional_producer(self.state_writer, self.topic, self._settings,
                                          f"{self.name}-p{partition}", self.transactional_id_of(partition),
                                          self.timeout_ms, on_fenced=lambda: self._fenced(partition, producer),
                                          fatal_is_fence=True, markers_settle_ms=self.markers_settle_ms)
        try:
            await producer.start(timeout_ms)
        except BaseException:
            await producer.close(0)
            raise
        self._owned[partition] = producer

    def _fenced(self, partition: int, producer: TransactionalProducer) -> None:
        if self._owned.get(partition) is producer:
            self._on_fenced(partition)

    async def release(self, partitions: Collection[int], flush_timeout_ms: int) -> None:
        """Stop writing the partitions: their writes in flight finish (bounded), then their producers close."""
        producers = [p for p in (self._owned.pop(partition, None) for partition in partitions) if p is not None]
        await asyncio.gather(*(p.close(flush_timeout_ms) for p in producers))

    async def close(self, flush_timeout_ms: int = 5_000) -> None:
        await self.release(list(self._owned), flush_timeout_ms)
