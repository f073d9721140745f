"""The relay's topic cache keeps nothing per topic name a client merely asked about (found by the relay fuzzer:
every distinct topic name in an OffsetCommit left a refresh time behind for good)."""

from __future__ import annotations

from types import SimpleNamespace

from coordinator.relay.cluster import _PRUNE_ABOVE, ClusterMetadata


async def test_refresh_times_of_unknown_topics_do_not_accumulate() -> None:
    asked: list[list[str]] = []

    async def refresh(topics: list[str]) -> SimpleNamespace:
        asked.append(topics)
        return SimpleNamespace(topics=[SimpleNamespace(name=t, error_code=3, partitions=()) for t in topics])

    cluster = ClusterMetadata(refresh, min_interval_ms=0)
    for n in range(3 * _PRUNE_ABOVE):
        assert await cluster.missing([(f"typo-{n}", 0)]) == {(f"typo-{n}", 0)}
    assert len(asked) == 3 * _PRUNE_ABOVE
    assert len(cluster._refreshed_at) <= _PRUNE_ABOVE + 1


async def test_a_topic_refreshed_within_the_min_interval_is_not_asked_for_again() -> None:
    asked: list[list[str]] = []

    async def refresh(topics: list[str]) -> SimpleNamespace:
        asked.append(topics)
        return SimpleNamespace(topics=[])

    cluster = ClusterMetadata(refresh, min_interval_ms=60_000)
    for n in range(_PRUNE_ABOVE + 10):  # past the pruning size: recent times are kept
        await cluster.missing([(f"t-{n}", 0)])
    await cluster.missing([("t-0", 0), (f"t-{_PRUNE_ABOVE + 5}", 0)])
    assert len(asked) == _PRUNE_ABOVE + 10
