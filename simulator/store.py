"""The state store over the simulated Kafka: the adapter between `GroupStore` and `SimKafka`.

It is the production `KafkaGroupStore` with its producer replaced by `SimProducer` and its reading replaced by a
replay of the simulated log through the production `StateReplay`. So the production write path runs as is:
record encoding (storage/records.py), the size check, the error mapping, the tombstone writer that keeps
failed tombstones owed and drops them when a newer write of their key is issued (storage/tombstones.py).
Only `start`, `read` and `close` — where the real store talks to a broker — are simulated here.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable

from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore
from coordinator.group.store import LoadedGroups
from coordinator.storage.loader import LoadError, StateReplay
from coordinator.storage.state_producers import producer_settings
from coordinator.timer import Clock
from simulator.kafka import SimKafka, SimProducer
from simulator.transactions import LedgeredPartitions


class SimulatedStore(KafkaGroupStore):
    def __init__(self, kafka: SimKafka, producer: SimProducer, partitions: int, commit_timeout_ms: int,
                 clock: Clock, load_timeout_ms: int = 30_000, read_ms: int = 20, *, client_id: str = "coordinator",
                 fencing: bool = False) -> None:
        config = StorageConfig(bootstrap="simulated", partitions=partitions, commit_timeout_ms=commit_timeout_ms,
                               event_topic=None, client_id=client_id, partition_fencing=fencing,
                               transactional_id="group-coordinator-state" if fencing else None)
        super().__init__(config, clock, load_timeout_ms=load_timeout_ms)
        self.kafka = kafka
        self.read_ms = read_ms
        if fencing:  # several instances: one transactional producer per owned partition (state_producers.py)
            writers = LedgeredPartitions(config.state_topic, producer_settings(config), "state-producer",
                                         "group-coordinator-state", commit_timeout_ms, self._partition_fenced)
            writers.process = client_id
            self._producer = self._fencing = writers
        else:
            self._producer = producer  # type: ignore[assignment]

    async def start(self) -> None:
        pass

    async def read(self, partitions: Iterable[int] | None = None, stop: threading.Event | None = None,
                   ends_after: threading.Event | None = None) -> LoadedGroups:
        wanted = sorted(range(self.config.partitions) if partitions is None else partitions)
        deadline_ms = self.kafka.now_ms() + self.load_timeout_ms
        if not await self.kafka.wait_up(deadline_ms):
            raise LoadError(f"state topic not readable within {self.load_timeout_ms} ms (simulated outage)")
        stop = stop or self._stop_loading
        while ends_after is not None and not ends_after.is_set():  # the end offsets once fenced (the loader)
            if stop.is_set() or self.kafka.now_ms() >= deadline_ms:
                raise LoadError("load stopped before the end offsets were taken")
            await asyncio.sleep(0.005)
        await asyncio.sleep(self.read_ms / 1000)  # end offsets first: what lands after them is not read
        ends = {partition: self.kafka.next_offsets[partition] for partition in wanted}
        await asyncio.sleep(self.read_ms / 1000)
        if not self.kafka.is_up:
            raise LoadError("broker went away while the state topic was read (simulated outage)")
        replay = StateReplay()
        for partition in wanted:
            for record in self.kafka.read(partition):
                if record.offset < ends[partition]:
                    replay.apply(record.key, record.value, f"{partition}@{record.offset}")
        return replay.state

    async def close(self) -> None:
        await super().close()  # stops the tombstone retries, closes (flushes, then kills) the producer
