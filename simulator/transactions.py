"""Transactional producers on the simulated Kafka: the production `TransactionalProducer` (group commit,
re-initialisation, fencing) and `TransactionClient` (what each librdkafka outcome means) run unmodified; below
them, `SimTxnProducer` answers as librdkafka's transactional producer does on a broker, and `SimSerialThread`
runs the client's blocking calls one after another on virtual time.

Kafka's transaction rules, per transactional.id (one per state partition: `<prefix>-p<partition>`):
  - `init_transactions` bumps the id's epoch, fences every producer of an older epoch and aborts the
    transaction an older one left open (its records never become visible);
  - a commit by a producer of an older epoch fails PRODUCER_FENCED (fatal): nothing of it is visible;
  - a commit is visible all at once (read_committed), or not at all: refused (NOT_ENOUGH_REPLICAS: the delivery
    fails, the commit fails _INCONSISTENT and must be aborted), acknowledgement lost (visible, the call times
    out), broker down (the transaction stays open until the next init aborts it; the call times out) or down
    while the EndTxn was on its way (either).
A call's effect happens when it is made; its answer comes after the latency (or the timeout) it took. Nothing of
a dead process runs: its serial thread stops, its open transaction is aborted by the partition's next owner.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from confluent_kafka import KafkaError, KafkaException

from coordinator.storage import transaction_client, transactions
from coordinator.storage.partition_writers import PartitionTransactions

if TYPE_CHECKING:
    from simulator.run import Simulation

_ACTIVE: list[Simulation] = []  # the simulation running now (one per process at a time)
_cost_s = [0.0]  # how long the call being made takes (set by SimTxnProducer, read by SimSerialThread)


class TaggedKey(bytes):
    """A record key that remembers the ledger write it belongs to (what is logged is plain bytes)."""

    write_id: int


@dataclass
class TxnState:
    """The transaction coordinator's view of one transactional.id."""

    epoch: int = 0
    open_epoch: int | None = None  # a transaction left open by that epoch (broker down at its commit)


@dataclass
class SimTxnProducer:
    """confluent_kafka.Producer with a transactional.id, as the state store uses it."""

    settings: dict[str, Any]
    epoch: int | None = None
    fatal: KafkaError | None = None
    current: list[tuple[int, bytes, bytes | None, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sim = _ACTIVE[-1]
        self.txn_id = str(self.settings["transactional.id"])
        self.process = str(self.settings["client.id"])

    @property
    def _state(self) -> TxnState:
        return self.sim.kafka.transactions.setdefault(self.txn_id, TxnState())

    def _rtt(self) -> None:
        faults, rng = self.sim.kafka.faults, self.sim.kafka.rng
        _cost_s[0] = (rng.randint(*faults.land_ms) + rng.randint(*faults.ack_ms)) / 1000

    def _raise_fatal(self) -> None:
        assert self.fatal is not None
        raise KafkaException(KafkaError(KafkaError._FATAL, "producer has a fatal error"))

    def init_transactions(self, timeout_s: float) -> None:
        if self.fatal is not None:
            self._raise_fatal()
        if not self.sim.kafka.is_up:
            _cost_s[0] = timeout_s
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "init_transactions timed out", retriable=True))
        state = self._state
        state.epoch += 1
        state.open_epoch = None  # aborted: never visible
        self.epoch = state.epoch
        self._rtt()
        self.sim.history.record("txn_init", txn=self.txn_id, epoch=self.epoch, process=self.process)

    def begin_transaction(self) -> None:
        if self.fatal is not None:
            self._raise_fatal()
        self.current = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = -1,
                on_delivery: Callable[[KafkaError | None, Any], None] | None = None) -> None:
        if self.fatal is not None:
            self._raise_fatal()
        assert key is not None
        self.current.append((partition, key, value, on_delivery))

    def commit_transaction(self, timeout_s: float) -> None:
        if self.fatal is not None:
            self._raise_fatal()
        kafka, rng, faults = self.sim.kafka, self.sim.kafka.rng, self.sim.kafka.faults
        records, self.current = self.current, []
        state = self._state
        self._rtt()
        if self.epoch != state.epoch:  # a newer producer holds the id
            self.fatal = KafkaError(KafkaError.PRODUCER_FENCED, "producer fenced by a newer epoch", fatal=True)
            self.sim.history.record("txn_fenced", txn=self.txn_id, epoch=self.epoch, process=self.process)
            raise KafkaException(self.fatal)
        roll = rng.random()
        if not kafka.is_up:  # the EndTxn reached the coordinator just before, or the transaction stays open
            if roll < 0.5:
                self._land(records)
            else:
                state.open_epoch = self.epoch
            _cost_s[0] = timeout_s
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit_transaction timed out", retriable=True))
        if roll < faults.refuse:
            error = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, "not enough replicas")
            for _, _, _, on_delivery in records:
                if on_delivery is not None:
                    on_delivery(error, None)
            raise KafkaException(KafkaError(KafkaError._INCONSISTENT, f"{len(records)} message(s) failed delivery",
                                            txn_requires_abort=True))
        self._land(records)
        if roll >= 1 - faults.ack_lost:
            _cost_s[0] = timeout_s
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit_transaction timed out", retriable=True))

    def _land(self, records: list[tuple[int, bytes, bytes | None, Any]]) -> None:
        by_write: dict[int, list[int]] = {}
        for partition, key, value, on_delivery in records:
            [offset] = self.sim.kafka.append(partition, [(partition, bytes(key), value)])
            if on_delivery is not None:  # librdkafka's delivery report, served while the commit flushes
                on_delivery(None, _Delivered(offset))
            write_id = getattr(key, "write_id", None)
            if write_id is not None:
                by_write.setdefault(write_id, []).append(offset)
        for write_id, offsets in by_write.items():
            self.sim.ledger.landed(write_id, offsets)

    def abort_transaction(self, timeout_s: float) -> None:
        if self.fatal is not None:
            self._raise_fatal()
        self.current = []
        if not self.sim.kafka.is_up:
            _cost_s[0] = timeout_s
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "abort_transaction timed out", retriable=True))
        self._rtt()

    def poll(self, timeout: float = 0) -> int:
        if self.fatal is not None:
            raise KafkaException(self.fatal)
        return 0

    def purge(self) -> None:
        self.current = []

    def flush(self, timeout: float = 0) -> int:
        return 0

    def close(self) -> None:
        pass


class SimSerialThread:
    """serial_thread.SerialThread on virtual time: a producer's calls, one after another, each answered after
    the time it took; none of a dead process's."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tail: asyncio.Future[Any] | None = None

    def submit(self, call: Callable[..., Any], *args: Any,
               then: Callable[[Any], None] | None = None) -> asyncio.Future[Any]:
        """As SerialThread.submit: `then(result)` runs as the result arrives, before the future's callbacks."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        previous, self._tail = self._tail, future
        loop.create_task(self._run(previous, future, call, args, then))
        return future

    def stop(self) -> None:
        pass

    async def _run(self, previous: asyncio.Future[Any] | None, future: asyncio.Future[Any],
                   call: Callable[..., Any], args: Sequence[Any], then: Callable[[Any], None] | None) -> None:
        sim = _ACTIVE[-1]
        client = getattr(call, "__self__", None)
        process = str(getattr(client, "settings", {}).get("client.id", ""))
        if previous is not None and not previous.done():
            await asyncio.wait([previous])
        instance = sim.processes.get(process)
        if instance is not None:
            await instance.running()  # a paused process makes its calls when it wakes
        if not sim.process_alive(process):
            return
        _cost_s[0] = 0.0
        try:
            result = call(*args)
        except Exception as exc:  # as SerialThread: a bug of ours, reported, and the thread goes on
            sim.checkers.violation("no_errors", f"{call.__name__} raised {exc!r}")
            result = KafkaError(KafkaError._FAIL, f"{call.__name__} failed: {exc!r}")
        cost_s, _cost_s[0] = _cost_s[0], 0.0
        if cost_s:
            await asyncio.sleep(cost_s)
        if sim.process_alive(process) and not future.done():
            if then is not None:
                then(result)
            future.set_result(result)


class _InlineThread:
    """threading.Thread for the client's retire(): its target runs at once (a fake client holds no thread)."""

    def __init__(self, target: Callable[..., Any], args: Sequence[Any] = (), **_: Any) -> None:
        self._target, self._args = target, args

    def start(self) -> None:
        self._target(*self._args)


class _Threading:
    Thread = _InlineThread


class _Delivered:
    """The acknowledged message as a delivery report hands it over (its offset is what the store reads)."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset


class LedgeredPartitions(PartitionTransactions):
    """The production PartitionTransactions; each send is also a write in the ledger (its keys tagged with the
    write, so the simulated broker can say when it landed) and its outcome is recorded."""

    process: str

    def send(self, records: Sequence[tuple[int, bytes, bytes | None]], *, offsets: list[int] | None = None
             ) -> asyncio.Future[KafkaError | None]:
        sim = _ACTIVE[-1]
        by_partition: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
        for record in records:
            by_partition.setdefault(record[0], []).append(record)
        tagged: list[tuple[int, bytes, bytes | None]] = []
        write_ids = []
        for partition, share in by_partition.items():
            write_id = sim.ledger.issued(self.process, partition, share)
            write_ids.append(write_id)
            for _, key, value in share:
                tagged_key = TaggedKey(key)
                tagged_key.write_id = write_id
                tagged.append((partition, tagged_key, value))
        outcome = super().send(tagged, offsets=offsets)

        def settled(done: asyncio.Future[KafkaError | None]) -> None:
            error = done.result()
            if sim.process_alive(self.process):
                for write_id in write_ids:
                    sim.ledger.outcome(write_id, "acked" if error is None else "txn:" + error.name())
        outcome.add_done_callback(settled)
        return outcome


@contextlib.contextmanager
def simulated_transactions(sim: Simulation) -> Iterator[None]:
    """The transactional producers of this run talk to the simulated Kafka, on virtual time."""
    replaced = [(transactions, "SerialThread", SimSerialThread), (transaction_client, "Producer", SimTxnProducer),
                (transaction_client, "threading", _Threading)]
    saved = [(module, name, getattr(module, name)) for module, name, _ in replaced]
    _ACTIVE.append(sim)
    for module, name, value in replaced:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
        _ACTIVE.remove(sim)
