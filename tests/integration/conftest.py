"""Fixtures shared by the integration tests."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from coordinator.embedded.jaeger import EmbeddedJaeger, built_jaeger


@pytest.fixture(scope="module")
def jaeger() -> Iterator[EmbeddedJaeger]:
    binary = built_jaeger()
    if binary is None:
        pytest.fail("the project's Jaeger build is missing: run scripts/setup.sh (it builds it once per machine)")
    with EmbeddedJaeger(binary) as running:
        yield running
