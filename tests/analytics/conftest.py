"""One SparkSession for every analytics test (starting one costs ~5 s on an idle machine, far more on a busy
one), local mode on loopback. It lives as long as tests/analytics: then the session is stopped and its JVM ended,
so the rest of the suite does not share the machine with an idle Spark driver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Spark's tests run after every other test: on a loaded machine the broker-outage e2e tests were seen to fail
    right after them in the same process (and pass alone), cause not yet found; this keeps them apart."""
    spark_tests = [item for item in items if "/tests/analytics/" in str(item.path)]
    if spark_tests:
        items[:] = [item for item in items if item not in spark_tests] + spark_tests


@pytest.fixture(scope="package")
def spark() -> Iterator[object]:
    from pyspark import SparkContext

    from analytics.session import build_session

    session = build_session("local[2]", app_name="coordinator-analytics-tests", shuffle_partitions=2)
    try:
        yield session
    finally:
        gateway = SparkContext._gateway
        session.stop()
        if gateway is not None:  # py4j's JVM outlives the session otherwise (until this process exits)
            gateway.shutdown()
            process = getattr(gateway, "proc", None)
            if process is not None:
                process.terminate()
                process.wait(30)
            SparkContext._gateway = None
            SparkContext._jvm = None
