"""The Kafka a bench runs against: $KAFKA_BOOTSTRAP when set, else an embedded Apache Kafka broker started for the
bench and removed afterwards (its data directory included). Benches that measure the broker itself (its process's
CPU) start EmbeddedKafka directly instead."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from coordinator.embedded import EmbeddedKafka


def _given() -> str | None:
    return os.environ.get("KAFKA_BOOTSTRAP") or None


def _progress() -> None:
    print("starting the embedded Apache Kafka broker ...", file=sys.stderr, flush=True)


@asynccontextmanager
async def bench_kafka(**broker_options: Any) -> AsyncIterator[str]:
    """The bootstrap address of the Kafka to bench against, for the duration of the block."""
    given = _given()
    if given:
        yield given
        return
    _progress()
    async with EmbeddedKafka(**broker_options) as broker:
        yield broker.bootstrap


@contextmanager
def bench_kafka_blocking(**broker_options: Any) -> Iterator[str]:
    """`bench_kafka` for benches that run without an event loop of their own."""
    given = _given()
    if given:
        yield given
        return
    _progress()
    with EmbeddedKafka(**broker_options) as broker:
        yield broker.bootstrap
