"""The state machine table (reference §2): every legal edge is allowed, every other edge raises."""
from __future__ import annotations

import itertools

import pytest

from coordinator.config import CoordinatorConfig
from coordinator.group.member import MemberMetadata
from coordinator.group.metadata import GroupMetadata, parse_subscription_topics
from coordinator.group.observer import GroupObserver, ObserverMux
from coordinator.group.state import VALID_PREVIOUS, GroupState, IllegalStateTransition
from tests.support.group_harness import RecordingObserver, subscription

S = GroupState
LEGAL = {
    (S.STABLE, S.PREPARING_REBALANCE), (S.COMPLETING_REBALANCE, S.PREPARING_REBALANCE),
    (S.EMPTY, S.PREPARING_REBALANCE), (S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE),
    (S.COMPLETING_REBALANCE, S.STABLE), (S.PREPARING_REBALANCE, S.EMPTY),
    *((s, S.DEAD) for s in S),
}


@pytest.mark.parametrize("source,target", list(itertools.product(S, S)), ids=lambda s: s.value)
def test_transition_table(source: GroupState, target: GroupState) -> None:
    observer = RecordingObserver()
    group = GroupMetadata("g", source, 0, observer)
    if (source, target) in LEGAL:
        group.transition_to(target, 42)
        assert group.state is target and group.current_state_timestamp_ms == 42
        assert observer.events == [("state", "g", source.value, target.value, 0)]
    else:
        with pytest.raises(IllegalStateTransition, match=f"Instead it is in {source.value} state"):
            group.transition_to(target, 42)
        assert group.state is source and observer.events == []


def test_can_rebalance_is_derived_from_the_table() -> None:
    for state in S:
        assert GroupMetadata("g", state, 0, GroupObserver()).can_rebalance == (
            state in VALID_PREVIOUS[S.PREPARING_REBALANCE])


def member(member_id: str, protocols: list[tuple[str, bytes]], instance: str | None = None) -> MemberMetadata:
    return MemberMetadata(member_id, instance, "c", "/h", 1000, 6000, "consumer", protocols)


def test_membership_bookkeeping_and_leader_handover() -> None:
    group = GroupMetadata("g", S.EMPTY, 0, GroupObserver())
    group.add(member("a", [("range", b"1")]))
    group.add(member("b", [("range", b"2"), ("rr", b"")], "ib"))
    assert group.leader_id == "a" and group.protocol_type == "consumer" and group.static_members == {"ib": "b"}
    assert group.candidate_protocols() == {"range"}
    group.remove("a")
    assert group.leader_id == "b" and group.supported_protocols["range"] == 1
    group.remove("b")
    assert group.leader_id is None and group.static_members == {}


def test_member_matches_and_vote() -> None:
    m = member("a", [("range", b"1"), ("rr", b"2")])
    assert m.matches([("range", b"1"), ("rr", b"2")])
    assert not m.matches([("rr", b"2"), ("range", b"1")]) and not m.matches([("range", b"x"), ("rr", b"2")])
    assert m.vote({"rr"}) == "rr" and m.vote({"range", "rr"}) == "range"


def test_subscription_topics_parse() -> None:
    assert parse_subscription_topics(subscription("a", "bb")) == ["a", "bb"]
    assert parse_subscription_topics(b"\x00") is None


def test_config_kafka_names_and_overrides() -> None:
    config = CoordinatorConfig()
    assert (config.group_min_session_timeout_ms, config.group_max_session_timeout_ms) == (6_000, 1_800_000)
    assert config.group_initial_rebalance_delay_ms == 3_000 and config.group_max_size == 2_147_483_647
    assert config.new_member_join_timeout_ms == 300_000 and config.offsets_retention_ms == 7 * 24 * 3_600_000
    changed = CoordinatorConfig.from_properties({"group.max.size": "10", "offsets.commit.timeout.ms": 100})
    assert changed.group_max_size == 10 and changed.offsets_commit_timeout_ms == 100
    with pytest.raises(ValueError):
        CoordinatorConfig(group_max_size=0)
    # the stored metadata string has an int16 length: a larger limit would accept commits it cannot store
    assert CoordinatorConfig(offset_metadata_max_bytes=32_767).offset_metadata_max_bytes == 32_767
    with pytest.raises(ValueError):
        CoordinatorConfig.from_properties({"offset.metadata.max.bytes": "32768"})


def test_observer_mux_isolates_failures() -> None:
    class Boom(GroupObserver):
        def on_member_left(self, *args):
            raise RuntimeError("boom")

    recorder = RecordingObserver()
    ObserverMux(Boom(), recorder).on_member_left("g", "m", None, "bye")
    assert recorder.events == [("left", "g", "m", None, "bye")]
