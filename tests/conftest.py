"""Shared fixtures: a real Apache Kafka broker for every test run.

`kafka_bootstrap` (session scope) takes, in order: the KAFKA_BOOTSTRAP env var (a cluster the user gives),
testcontainers' Kafka when a Docker engine answers, the embedded broker. `restartable_kafka` is a broker of the
test's own that the test may stop and start (always embedded: a given cluster cannot be restarted from here).
`kafka_cluster` (module scope, opt-in) is an embedded 3-broker KRaft cluster a module shares and may stop and
start brokers of (a test that stops one restarts it).

Under pytest-xdist (`-n 2`, or PYTEST_WORKERS=2 for scripts/test.sh) each worker is its own process with its own
session broker, and is handed whole test modules (xdist_unit).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import settings

from coordinator.embedded import (EmbeddedKafka, EmbeddedKafkaCluster, kafka_version, process_alive,
                                  started_processes)
from tests.support import java_consumer, watchdog

log = logging.getLogger("tests")

# No per-example time limit (Hypothesis' default 200 ms): a property is about results, and an example that takes
# longer on a loaded machine is not a failure (a v3 group value property failed once at load 8 and passed on replay).
settings.register_profile("project", deadline=None)
settings.load_profile("project")

_KAFKA_FIXTURES = {"kafka_bootstrap", "restartable_kafka", "kafka_cluster"}


def pytest_configure(config: pytest.Config) -> None:
    # here, not in pyproject.toml's list: a change there makes scripts/setup.sh install the project again
    config.addinivalue_line("markers", "pure_only(reason): tests what only the pure tree has; the compiled unit "
                                       "run (scripts/compiled_pytest.py) deselects it and counts it")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _KAFKA_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        if "/interop/" in str(item.path):
            item.add_marker(pytest.mark.interop)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown (and never called) without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`-n N` (dist mode "load") hands out whole modules (xdist_unit); an explicit --dist keeps xdist's own."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

    return ModuleScheduling(config, log)


def xdist_unit(nodeid: str) -> str:
    """What one xdist worker runs as a whole: a test module, so its module-scoped fixtures (a cluster, Jaeger, a
    broker asked for by name while a test runs) start once and its tests run in the order they were written;
    tests/analytics as one, so it has one SparkSession (package scope)."""
    path = nodeid.split("::", 1)[0]
    return "tests/analytics" if path.startswith("tests/analytics/") else path


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
    with EmbeddedKafka() as broker:
        yield broker.bootstrap


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


_WORKER_LEFTOVERS: list[str] = []  # the xdist controller's: what its workers reported (pytest_testnodedown)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any broker or Java consumer JVM started by it is still alive (and kill it). An xdist worker
    hands what it found to the controller (a worker's exit status does not fail the run), which fails it."""
    # (pid, start time): on a busy machine a long run wraps pid_max, and a bare pid may name someone else's process
    alive = [pid for pid, started in started_processes() + java_consumer.started_processes()
             if process_alive(pid, started)]
    leftovers = [f"{pid}: {command_line(pid)[:300]}" for pid in alive]
    for pid in alive:
        os.kill(pid, 9)
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        worker_output["leftover_jvms"] = leftovers
        return
    leftovers += _WORKER_LEFTOVERS
    if leftovers:
        message = "JVMs left running by the tests (killed now): " + "; ".join(leftovers)
        log.error("%s", message)
        print(f"\n{message}", file=sys.stderr)  # the log may not be shown this late in the session
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown (and never called) without it
def pytest_testnodedown(node: object, error: object) -> None:
    """An xdist worker finished: keep the JVMs it found left running, for the controller's pytest_sessionfinish."""
    output = getattr(node, "workeroutput", None) or {}
    _WORKER_LEFTOVERS.extend(output.get("leftover_jvms", ()))


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"



def _phase_default_s() -> float:
    return float(os.environ.get("TEST_PHASE_TIMEOUT_S", watchdog.DEFAULT_PHASE_S))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with watchdog.deadline(item, "setup", watchdog.phase_limit(item, "setup", _phase_default_s())):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with watchdog.deadline(item, "call", watchdog.phase_limit(item, "call", _phase_default_s())):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with watchdog.deadline(item, "teardown", watchdog.phase_limit(item, "teardown", _phase_default_s())):
        yield
