"""Shared fixtures: a real Apache Kafka broker for every test run.

`kafka_bootstrap` (session scope) takes, in order: the KAFKA_BOOTSTRAP env var (a cluster the user gives),
testcontainers' Kafka when a Docker engine answers, the embedded broker. `restartable_kafka` is a broker of the
test's own that the test may stop and start (always embedded: a given cluster cannot be restarted from here).
`kafka_cluster` (module scope, opt-in) is an embedded 3-broker KRaft cluster a module shares and may stop and
start brokers of (a test that stops one restarts it).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator

import pytest

from coordinator.embedded import (EmbeddedKafka, EmbeddedKafkaCluster, kafka_version, process_alive,
                                  started_processes)
from tests.support import java_consumer

log = logging.getLogger("tests")

_KAFKA_FIXTURES = {"kafka_bootstrap", "restartable_kafka", "kafka_cluster"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _KAFKA_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        if "/interop/" in str(item.path):
            item.add_marker(pytest.mark.interop)


def _docker_engine_answers() -> bool:
    try:
        import docker  # installed with testcontainers

        docker.from_env(timeout=3).ping()
        return True
    except Exception:  # no engine, no socket, no permission: all mean "not here"
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    given = os.environ.get("KAFKA_BOOTSTRAP")
    if given:
        yield given
        return
    if _docker_engine_answers():
        container = _start_container()
        if container is not None:
            try:
                yield container.get_bootstrap_server()
            finally:
                container.stop()
            return
    broker = EmbeddedKafka()
    broker.start_blocking()
    try:
        yield broker.bootstrap
    finally:
        broker.stop_blocking()
        broker.remove_data()


def _start_container():  # type: ignore[no-untyped-def]
    try:
        from testcontainers.kafka import KafkaContainer

        return KafkaContainer(f"apache/kafka:{kafka_version()}").with_kraft().start()
    except Exception as exc:  # an engine that answers ping may still refuse to run it
        log.warning("testcontainers Kafka did not start (%s); using the embedded broker", exc)
        return None


@pytest.fixture
def restartable_kafka() -> Iterator[EmbeddedKafka]:
    broker = EmbeddedKafka()
    broker.start_blocking()
    try:
        yield broker
    finally:
        broker.stop_blocking()
        broker.remove_data()


@pytest.fixture(scope="module")
def kafka_cluster() -> Iterator[EmbeddedKafkaCluster]:
    cluster = EmbeddedKafkaCluster(brokers=3)
    cluster.start_blocking()
    try:
        yield cluster
    finally:
        cluster.stop_blocking()
        cluster.remove_data()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any broker or Java consumer JVM started by it is still alive (and kill it)."""
    # (pid, start time): on a busy machine a long run wraps pid_max, and a bare pid may name someone else's process
    leftovers = [(pid, command_line(pid)) for pid, started in started_processes() + java_consumer.started_processes()
                 if process_alive(pid, started)]
    for pid, _command in leftovers:
        os.kill(pid, 9)
    if leftovers:
        message = "JVMs left running by the tests (killed now): " + "; ".join(
            f"{pid}: {command[:300]}" for pid, command in leftovers)
        log.error("%s", message)
        print(f"\n{message}", file=sys.stderr)  # the log may not be shown this late in the session
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"

