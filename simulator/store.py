"""The state store over the simulated Kafka: the adapter between `GroupStore` and `SimKafka`.

It is the production `KafkaGroupStore` with its producer replaced by `SimProducer` and its reading replaced by a
replay of the simulated log through the production `StateReplay`. So the production write path runs as is:
record encoding (storage/records.py), the size check, the error mapping, the tombstone writer that keeps
failed tombstones owed and drops them when a newer write of their key is issued (storage/tombstones.py).
Only `start`, `read` and `close` — where the real store talks to a broker — are simulated here. The read is the
production loader's transaction tracking (storage/transaction_log.py `TransactionTracker`: committed client
transactions applied, aborted ones dropped, open ones handed over as pending) over `SimKafka.fetch`, and the
partitions' live tails are the production `TransactionTails` with their fetch replaced (`SimTails`): it runs
as tasks of the instance's (virtual) loop instead of a thread of its own, and reads `SimKafka` instead of a
broker; what it does with a fetch (`TailReader`, the producer-id naming, the delivery to the shard's
loop, follow/stop) is production code.
"""
from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable, Iterable

from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore
from coordinator.group.store import LoadedGroups
from coordinator.storage.loader import LoadError, StateReplay
from coordinator.storage.state_producers import producer_settings
from coordinator.storage.transaction_log import TransactionTracker
from coordinator.storage.txn_tail import Deliver, TailReader, TransactionTails, _call_on
from coordinator.storage.uncommitted_load import UncommittedLoad
from coordinator.timer import Clock
from protocol.fetch_reader import FetchedRecord
from simulator.kafka import SimKafka, SimProducer
from simulator.transactions import LedgeredPartitions

TAIL_RETRY_S = 0.5  # txn_tail's pause after a failed fetch
STOP_POLL_MS = 50  # how often a read waiting for the broker looks at its stop event (loader.py polls every 50 ms)


class SimulatedStore(KafkaGroupStore):
    def __init__(self, kafka: SimKafka, producer: SimProducer, partitions: int, commit_timeout_ms: int,
                 clock: Clock, load_timeout_ms: int = 30_000, read_ms: int = 20, *, client_id: str = "coordinator",
                 fencing: bool = False, tails: SimTails | None = None) -> None:
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
        self._tails = tails  # None: no client transactions in the run (nothing to follow)

    async def start(self) -> None:
        pass

    async def read(self, partitions: Iterable[int] | None = None, stop: threading.Event | None = None,
                   ends_after: threading.Event | None = None) -> LoadedGroups:
        wanted = sorted(range(self.config.partitions) if partitions is None else partitions)
        deadline_ms = self.kafka.now_ms() + self.load_timeout_ms
        stop = stop or self._stop_loading
        # the loader's polls: it ends as soon as it is stopped (a load abandoned, the store closing), up or down
        while not await self.kafka.wait_up(min(deadline_ms, self.kafka.now_ms() + STOP_POLL_MS)):
            if stop.is_set():
                raise LoadError("loading stopped: the store is closing or the load was abandoned")
            if self.kafka.now_ms() >= deadline_ms:
                raise LoadError(f"state topic not readable within {self.load_timeout_ms} ms (simulated outage)")
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
        load = UncommittedLoad()
        for partition in wanted:
            def apply(record: FetchedRecord, partition: int = partition) -> None:
                replay.apply(record.key, record.value, f"{partition}@{record.offset}", log_offset=record.offset)

            tracker = TransactionTracker(apply)
            for batch in self.kafka.fetch(partition, 0, ends[partition]):
                tracker.feed(batch)
            load.settled[partition] = tracker.settled_sequences(())
            pending = tracker.finish(())  # our writers' records land committed: every open batch is a client's
            if pending:
                load.pending[partition] = pending
            load.positions[partition] = ends[partition]
        state = replay.state
        self._take_transactions(state, load)
        return state

    async def close(self) -> None:
        await super().close()  # stops the tombstone retries, closes (flushes, then kills) the producer


class SimTails(TransactionTails):
    """The production partition tails on the simulation's loop, reading SimKafka (one fetch per poll: what is
    in the log past the position, after a seeded wait; a poll that would find nothing of a client's waits for it
    instead, or for one of our offset tombstones). `running` holds a paused process's tails."""

    def __init__(self, kafka: SimKafka, topic: str, rng: random.Random,
                 running: Callable[[], Awaitable[None]]) -> None:
        super().__init__("simulated", None, topic, lambda transactional_id: False)
        self.kafka = kafka
        self.rng = rng
        self.running = running

    def _tails_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    async def _tail(self, partition: int, start: int, caller: asyncio.AbstractEventLoop, deliver: Deliver,
                    settling: tuple[int, ...]) -> None:
        position = start
        reader = TailReader(settling)
        while True:
            await asyncio.sleep(self.rng.randint(5, self.max_wait_ms) / 1000)  # the fetch's long poll
            await self.running()
            if not self.kafka.is_up:  # a lost connection: the same position after a pause
                await asyncio.sleep(TAIL_RETRY_S)
                continue
            batches = self.kafka.fetch(partition, position)
            unknown = self.owners.unknown(batches)
            if unknown:  # ListTransactions: no producer of ours writes transactional batches in the simulated log
                self.owners.learn(unknown, {producer_id: ("application", "Ongoing") for producer_id in unknown})
            events = reader.events(batches, self.owners.is_ours)
            next_position = batches[-1].last_offset + 1 if batches else position
            if events:
                await asyncio.wrap_future(_call_on(caller, deliver, events, next_position))
            else:  # the polls that find nothing of a client's change nothing: skipped
                await self.kafka.client_data(partition)
            position = next_position

    def kill(self) -> None:
        """The process died: its tails stop where they are."""
        self._followed.clear()
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

    async def close(self, timeout_s: float = 5.0) -> None:
        self.kill()
