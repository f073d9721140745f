"""Real Kafka clients beside the simulated ones (`coordinator simulate --real N`): N consumers, confluent-kafka
(librdkafka) and aiokafka alternating, in one group reading the topic through the relay (bootstrapped to the
coordinator's listener), and one confluent-kafka producer writing a trickle of records through the relay so they
have something to read. Each counts records consumed and rebalances seen (assignments received); at the end each
closes as a real consumer does (close -> LeaveGroup)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coordinator.security.clusters import ClusterSecurity

log = logging.getLogger("coordinator.loadgen.real")


@dataclass
class RealConsumerStats:
    name: str
    client: str
    records: int = 0
    rebalances: int = 0  # assignments received
    partitions: int = 0  # assigned now
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "client": self.client, "records": self.records, "rebalances": self.rebalances,
                "partitions": self.partitions, "errors": self.errors[-5:]}


class RealClients:
    def __init__(self, bootstrap: str, topic: str, count: int, group_id: str, records_per_s: float = 20.0, *,
                 group_protocol: str = "classic", security: ClusterSecurity | None = None) -> None:
        """`group_protocol` "consumer": KIP-848 consumers, all confluent-kafka (aiokafka speaks only classic).
        `security`: TLS and SASL of every client (None: PLAINTEXT)."""
        self.bootstrap, self.topic, self.group_id, self.records_per_s = bootstrap, topic, group_id, records_per_s
        self.group_protocol = group_protocol
        self._librdkafka: dict[str, str] = {}
        self._aiokafka_settings: dict[str, object] = {}
        if security is not None:
            self._librdkafka = dict(security.librdkafka)
            self._aiokafka_settings = security.client.aiokafka_settings(security.ssl_context)
        self.consumers = [RealConsumerStats(f"{group_id}-{i}", "confluent-kafka" if i % 2 == 0
                                            or group_protocol == "consumer" else "aiokafka") for i in range(count)]
        self.produced = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def started(self) -> bool:
        return bool(self._threads)

    def start(self) -> None:
        self._threads.append(threading.Thread(target=self._produce, name="real-producer", daemon=True))
        for stats in self.consumers:
            if stats.client == "confluent-kafka":
                self._threads.append(threading.Thread(target=self._confluent, args=(stats,), name=stats.name,
                                                      daemon=True))
            else:
                self._tasks.append(asyncio.create_task(self._aiokafka(stats)))
        for thread in self._threads:
            thread.start()

    async def stop(self, timeout_s: float = 20.0) -> None:
        """Every consumer closes (LeaveGroup); bounded in time."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        if self._tasks:
            _done, pending = await asyncio.wait(self._tasks, timeout=timeout_s)
            for task in pending:
                task.cancel()
        for thread in self._threads:
            await asyncio.to_thread(thread.join, max(0.1, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("event=real_client_stop_timeout name=%s", thread.name)

    def summary(self) -> dict[str, Any]:
        return {"bootstrap": self.bootstrap, "group": self.group_id, "produced": self.produced,
                "consumers": [stats.as_dict() for stats in self.consumers]}

    def status(self) -> str:
        return ", ".join(f"{s.client} {s.partitions}p {s.records} rec" for s in self.consumers)

    # ----------------------------------------------------------------------------------------------- clients

    def _produce(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 20, "log_level": 3,
                             **self._librdkafka})
        try:
            while not self._stop.wait(1.0 / self.records_per_s):
                producer.produce(self.topic, key=str(self.produced).encode(), value=b"real-record",
                                 on_delivery=self._delivered)
                producer.poll(0)
        finally:
            producer.flush(5)

    def _delivered(self, error: Any, _message: Any) -> None:
        if error is None:
            self.produced += 1
        else:
            log.warning("event=real_produce_failed error=%s", error)

    def _confluent(self, stats: RealConsumerStats) -> None:
        from confluent_kafka import Consumer

        def on_assign(_consumer: Any, partitions: list[Any]) -> None:
            stats.rebalances += 1
            stats.partitions = len(partitions)

        def on_revoke(_consumer: Any, _partitions: list[Any]) -> None:
            stats.partitions = 0

        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "group.id": self.group_id,
                                  "client.id": stats.name, "auto.offset.reset": "earliest", "log_level": 3,
                                  **self._librdkafka}
        if self.group_protocol == "consumer":  # the coordinator decides the assignment and the timeouts
            config["group.protocol"] = "consumer"
        else:
            config.update({"partition.assignment.strategy": "roundrobin", "session.timeout.ms": 10_000,
                           "heartbeat.interval.ms": 1_000})
        consumer = Consumer(config)
        consumer.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)
        try:
            while not self._stop.is_set():
                message = consumer.poll(0.5)
                if message is None:
                    continue
                if message.error():
                    stats.errors.append(str(message.error()))
                else:
                    stats.records += 1
        finally:
            consumer.close()  # commits and sends LeaveGroup

    async def _aiokafka(self, stats: RealConsumerStats) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.abc import ConsumerRebalanceListener

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: Any) -> None:
                stats.partitions = 0

            async def on_partitions_assigned(self, assigned: Any) -> None:
                stats.rebalances += 1
                stats.partitions = len(assigned)

        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group_id, client_id=stats.name,
                                    auto_offset_reset="earliest", session_timeout_ms=10_000,
                                    heartbeat_interval_ms=1_000, **self._aiokafka_settings)
        consumer.subscribe([self.topic], listener=Listener())
        try:
            await consumer.start()
            while not self._stop.is_set():
                batches = await consumer.getmany(timeout_ms=500)
                stats.records += sum(len(records) for records in batches.values())
        except Exception as exc:  # noqa: BLE001 -- shown in the summary; the simulation goes on
            stats.errors.append(repr(exc))
            log.warning("event=real_consumer_failed name=%s error=%r", stats.name, exc)
        finally:
            await consumer.stop()  # commits and sends LeaveGroup
