"""Fixtures shared by the integration tests."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from coordinator.embedded.broker import EmbeddedKafka
from coordinator.embedded.jaeger import EmbeddedJaeger, built_jaeger
from tests.support import kafka_store


@pytest.fixture(scope="module")
def jaeger() -> Iterator[EmbeddedJaeger]:
    binary = built_jaeger()
    if binary is None:
        pytest.fail("the project's Jaeger build is missing: run scripts/setup.sh (it builds it once per machine)")
    with EmbeddedJaeger(binary) as running:
        yield running


@pytest.fixture(scope="module")
def kafka_tv1() -> Iterator[str]:
    """A broker of its own (own data dir and ports, stopped here) formatted with transaction.version=1."""
    with EmbeddedKafka(features={"transaction.version": 1}, heap_mb=384,
                       jvm_options=("-XX:TieredStopAtLevel=1",)) as broker:
        yield broker.bootstrap


@pytest.fixture(params=kafka_store.STATE_WRITERS)
def state_writer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test once per transactional writer (librdkafka's, our own): the stores it starts write with it."""
    monkeypatch.setattr(kafka_store, "STATE_WRITER", request.param)
    return str(request.param)
