"""The GC safety net: a cycle that died after the policy froze it is found and freed by a reclaim, and said so."""
from __future__ import annotations

import asyncio
import gc
import logging
import weakref

import pytest

from coordinator.runtime_health import RuntimeHealth, reclaim_frozen_cycles


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _frozen_cycle() -> weakref.ref[_Node]:
    """Two objects pointing at each other, frozen while alive (as the policy would), then dropped."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gc.collect()
    gc.freeze()
    return weakref.ref(a)


def test_a_frozen_cycle_survives_collections_until_a_reclaim_frees_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="coordinator.runtime")
    try:
        dead = _frozen_cycle()
        gc.collect()
        assert dead() is not None  # the leak the policy risks: frozen garbage is never collected
        reclaimed = reclaim_frozen_cycles("test")
        assert dead() is None
        assert reclaimed.collected >= 2 and reclaimed.frozen_before > 0 and reclaimed.pause_ms > 0
        assert gc.get_freeze_count() > 0  # refrozen: what lives stays out of the collector's reach
        line = next(r for r in caplog.records if "event=gc_reclaim" in r.getMessage())
        assert line.levelno == logging.WARNING and "reason=test" in line.getMessage()
    finally:
        gc.unfreeze()


async def test_the_service_reclaims_at_the_configured_interval_and_counts_it() -> None:
    assert RuntimeHealth.from_env({}).reclaim_interval_s == 0  # off unless asked (docs/operations.md)
    health = RuntimeHealth.from_env({"COORDINATOR_GC_RECLAIM_INTERVAL_S": "0.05",
                                     "COORDINATOR_HEALTH_LOG_INTERVAL_S": "0"})
    try:
        dead = _frozen_cycle()
        health.start()
        for _ in range(200):  # bounded: until the first reclaim ran
            if health.policy.reclaims:
                break
            await asyncio.sleep(0.05)
        assert health.policy.reclaims >= 1 and dead() is None
        snapshot = health.snapshot()
        assert snapshot["gc_reclaims"] >= 1 and snapshot["gc_reclaimed_objects"] >= 2
    finally:
        await health.stop()
        gc.unfreeze()
