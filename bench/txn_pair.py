"""A probe of "two transactional ids per state partition, used in turn" (docs/architecture.md, "Two transactional
ids per partition"): what it would gain, and whether Kafka keeps the two ids' commit markers in the order their
EndTxn calls were answered. Raw confluent-kafka producers on one partition of a fresh topic; no coordinator code
in the write path (the state store's loader reads the result back).

  python -m bench.txn_pair [--modes one,alternate,pipelined,gated] [--seconds 4] [--repeats 2] [--records 1]

Modes, each a run of back-to-back transactions for `--seconds` (each transaction writes `--records` group records):
- one: one transactional id; the next transaction begins when the last commit returned (today's single writer).
- alternate: two ids, used in turn, no overlap: the next transaction begins on the other id when the last commit
  returned (no AddPartitionsToTxn meets CONCURRENT_TRANSACTIONS: the other id's markers are long written).
- pipelined: two ids, used in turn; transaction n+1 begins and its records are produced and acknowledged while
  transaction n commits (n+1 produced only after n's records are acknowledged; its EndTxn only after n's commit
  returned) — the design as briefed.
- gated: pipelined, and n+1's EndTxn also waits until n's transaction coordinator has written n's markers
  (DescribeTransactions polled until n's id leaves PrepareCommit): the variant that keeps the markers in order
  (one broker only: the bootstrap broker is asked).

Per run: transactions, ms per transaction, a transaction's latency (begin → commit returned) p50/p90, the
AddPartitionsToTxn refused CONCURRENT_TRANSACTIONS per transaction (librdkafka's `eos` debug lines), and from the
partition read back raw: **marker inversions** (consecutive transactions, in data order, whose COMMIT markers landed
in the other order) and **stale groups** (transaction n writes group g<n//2> at generation n; the store's loader,
which applies a transaction at its COMMIT marker, must load generation 2k+1 for g<k>: a stale one loads 2k).
The broker is the embedded one unless KAFKA_BOOTSTRAP is set. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from bench.state_writes import _Counts
from bench.kafka import bench_kafka
from coordinator.group.records import GroupMetadataRecord
from coordinator.storage.config import StorageConfig
from coordinator.storage.kafka_store import KafkaGroupStore
from coordinator.storage.records import encode
from protocol.client import KafkaClient
from protocol import apis
from protocol.fetch_reader import fetch, tolerant_request
from protocol.messages import build
from tests.support.kafka_store import stable_group

_TIMEOUT_S = 30.0
_DESCRIBE_TRANSACTIONS = 65


def _record(n: int) -> tuple[bytes, bytes | None]:
    return encode(GroupMetadataRecord(f"g{n // 2}", stable_group(generation=n, size=1)))


class _Writer:
    """Transactions on `producers` in turn (n on producers[n % len]); latencies in ms, stamped per transaction."""

    def __init__(self, topic: str, producers: list[Producer], records: int) -> None:
        self.topic = topic
        self.producers = producers
        self.records = records
        self.latencies: list[float] = []
        self.committed = 0

    def _produce(self, producer: Producer, n: int) -> None:
        key, value = _record(n)
        for _ in range(self.records):
            producer.produce(self.topic, key=key, value=value, partition=0)

    def sequential(self, until: float) -> None:
        """one / alternate: begin, produce, commit; the next on the next producer once this one returned."""
        n = 0
        while time.perf_counter() < until:
            producer = self.producers[n % len(self.producers)]
            started = time.perf_counter()
            producer.begin_transaction()
            self._produce(producer, n)
            producer.commit_transaction(_TIMEOUT_S)
            self.latencies.append((time.perf_counter() - started) * 1000)
            n += 1
        self.committed = n

    def pipelined(self, until: float, before_commit: Callable[[int], None] | None = None) -> None:
        """Two threads, one per producer: transaction n staged (begin, produce, flush: its records acknowledged)
        once n-1 is staged, committed once n-1's commit returned (and `before_commit(n - 1)` returned, if given).
        The first transaction to find the time up is not begun; it and every later one only release the next
        thread."""
        lock = threading.Lock()
        staged: dict[int, threading.Event] = {}
        committed: dict[int, threading.Event] = {}
        stop_at: list[int] = []  # the last transaction begun

        def event(table: dict[int, threading.Event], n: int) -> threading.Event:
            with lock:
                return table.setdefault(n, threading.Event())

        event(staged, -1).set()
        event(committed, -1).set()

        def run(parity: int) -> None:
            producer = self.producers[parity]
            n = parity
            while True:
                event(staged, n - 1).wait()
                with lock:
                    if not stop_at and time.perf_counter() >= until:
                        stop_at.append(n - 1)
                    finished = bool(stop_at) and n > stop_at[0]
                if finished:
                    event(staged, n).set()
                    return
                started = time.perf_counter()
                producer.begin_transaction()
                self._produce(producer, n)
                remaining = producer.flush(_TIMEOUT_S)
                assert remaining == 0, "records not acknowledged"
                event(staged, n).set()
                event(committed, n - 1).wait()
                if before_commit is not None and n > 0:
                    before_commit(n - 1)
                producer.commit_transaction(_TIMEOUT_S)
                self.latencies.append((time.perf_counter() - started) * 1000)
                event(committed, n).set()
                n += 2

        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.committed = stop_at[0] + 1


class _MarkersWritten:
    """`wait(n)`: until transaction n's id is no longer PrepareCommit at its transaction coordinator
    (DescribeTransactions; CompleteCommit is written once every marker is in), polled back to back. Asks the
    bootstrap broker: one broker only (it coordinates every transactional id)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: KafkaClient, ids: list[str]) -> None:
        self.loop = loop
        self.client = client
        self.ids = ids
        self.waited_ms: list[float] = []
        self.polls = 0

    async def _state(self, transactional_id: str) -> str:
        request = build(apis.request_class(_DESCRIBE_TRANSACTIONS, 0), transactional_ids=(transactional_id,))
        answer = await tolerant_request(self.client, request)
        return str(answer.transaction_states[0].transaction_state)

    def wait(self, n: int) -> None:
        started = time.perf_counter()
        transactional_id = self.ids[n % len(self.ids)]
        while True:
            self.polls += 1
            state = asyncio.run_coroutine_threadsafe(self._state(transactional_id), self.loop).result(_TIMEOUT_S)
            if state not in ("PrepareCommit", "PrepareAbort"):
                break
        self.waited_ms.append((time.perf_counter() - started) * 1000)


async def _markers(bootstrap: str, topic: str) -> tuple[int, int]:
    """(transactions found, consecutive ones in data order whose COMMIT markers are in the other order)."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    first_data: dict[int, int] = {}  # producer id -> its open transaction's first data offset
    closed: list[tuple[int, int]] = []  # (first data offset, marker offset)
    async with await KafkaClient.connect(host, int(port)) as client:
        position, end = 0, None
        while end is None or position < end:
            answer = await fetch(client, topic, 0, position, max_wait_ms=100)
            end = answer.high_watermark
            for batch in answer.batches:
                if batch.is_control:
                    if batch.producer_id in first_data:
                        closed.append((first_data.pop(batch.producer_id), batch.base_offset))
                elif batch.is_transactional:
                    first_data.setdefault(batch.producer_id, batch.base_offset)
            position = answer.next_offset
    closed.sort()
    inversions = sum(1 for (_, m1), (_, m2) in zip(closed, closed[1:]) if m2 < m1)
    return len(closed), inversions


async def _stale_groups(bootstrap: str, topic: str, prefix: str, transactions: int) -> int:
    """Groups whose loaded generation is not the last one written (the store's own loader)."""
    store = KafkaGroupStore(StorageConfig(bootstrap=bootstrap, state_topic=topic, partitions=1, event_topic=None,
                                          transactional_id=prefix), load_timeout_ms=60_000)
    state = await store.read([0])
    stale = 0
    for k in range(transactions // 2):  # complete pairs only
        record = state.groups.get(f"g{k}")
        if record is None or record.generation != 2 * k + 1:
            stale += 1
    return stale


async def one_run(bootstrap: str, mode: str, seconds: float, records: int) -> dict[str, Any]:
    counts = _Counts()
    logger = logging.getLogger(f"bench.txn_pair.librdkafka.{time.monotonic_ns()}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(counts)
    topic = f"__txn-pair-{uuid.uuid4().hex[:10]}"
    prefix = f"{topic}-writer"
    creator = KafkaGroupStore(StorageConfig(bootstrap=bootstrap, state_topic=topic, partitions=1, event_topic=None))
    await creator.start()  # creates the topic as the server does (compacted, one partition here)
    await creator.close()
    ids = [f"{prefix}-p0"] if mode == "one" else [f"{prefix}-p0", f"{prefix}-p0-b"]
    producers = [Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5,
                           "transaction.timeout.ms": 10_000, "debug": "eos", "logger": logger,
                           "socket.nagle.disable": True}) for tid in ids]
    writer = _Writer(topic, producers, records)
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    client = await KafkaClient.connect(host, int(port))
    gate = _MarkersWritten(asyncio.get_running_loop(), client, ids)
    try:
        for producer in producers:
            await asyncio.to_thread(producer.init_transactions, _TIMEOUT_S)
        run: Callable[[float], None] = {
            "pipelined": writer.pipelined,
            "gated": lambda until: writer.pipelined(until, gate.wait),
        }.get(mode, writer.sequential)
        await asyncio.to_thread(run, time.perf_counter() + 0.5)  # warm-up (its groups are written again below)
        warm = writer.committed
        writer.latencies.clear()
        gate.waited_ms.clear()
        gate.polls = 0
        counts.concurrent = counts.registering = 0
        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.to_thread(run, started + seconds)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        await client.close()
        for producer in producers:
            await asyncio.to_thread(producer.flush, 5.0)
    done = max(writer.committed, 1)
    latencies = sorted(writer.latencies)
    found, inversions = await _markers(bootstrap, topic)
    stale = await _stale_groups(bootstrap, topic, prefix, writer.committed)
    return {"mode": mode, "records": records, "transactions": writer.committed, "warm_up_transactions": warm,
            "ms_per_transaction": round(elapsed * 1000 / done, 2),
            "latency_ms_p50": round(latencies[len(latencies) // 2], 2) if latencies else None,
            "latency_ms_p90": round(latencies[int(len(latencies) * 0.9)], 2) if latencies else None,
            "cpu_ms_per_transaction": round(cpu * 1000 / done, 2),
            "concurrent_transactions_per_transaction": round(counts.concurrent / done, 3),
            "markers_wait_ms_p50": round(sorted(gate.waited_ms)[len(gate.waited_ms) // 2], 2)
            if gate.waited_ms else None, "describe_polls_per_transaction": round(gate.polls / done, 2),
            "transactions_in_log": found, "marker_inversions": inversions, "stale_groups_loaded": stale,
            "load_average_1m": round(os.getloadavg()[0], 1)}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    async with bench_kafka() as bootstrap:
        for _ in range(args.repeats):
            for mode in args.modes:
                run = await one_run(bootstrap, mode, args.seconds, args.records)
                print(json.dumps(run), file=sys.stderr, flush=True)
                runs.append(run)
    return {"bench": "txn_pair", "runs": runs}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", type=lambda s: s.split(","), default=["one", "alternate", "pipelined", "gated"])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--records", type=int, default=1)
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse_args()))))
