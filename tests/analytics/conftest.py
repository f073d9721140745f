"""One SparkSession for every analytics test (starting one costs ~5 s on an idle machine, far more on a busy
one), local mode on loopback, stopped at the end of the run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from analytics.session import build_session

    session = build_session("local[2]", app_name="coordinator-analytics-tests", shuffle_partitions=2)
    try:
        yield session
    finally:
        session.stop()
