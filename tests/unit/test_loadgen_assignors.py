"""The simulated leaders' assignors: range as Kafka's RangeAssignor, cooperative-sticky's invariants (balanced,
sticky, never two owners at once, everything assigned once the revoking members have rejoined)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.loadgen.assignors import assign, cooperative_sticky_assign, range_assign, revoked
from protocol.consumer_protocol import Subscription


def counts(result):  # type: ignore[no-untyped-def]
    return {m: sum(len(ids) for _t, ids in a.partitions) for m, a in result.items()}


def owned(result):  # type: ignore[no-untyped-def]
    return {m: {(t, p) for t, ids in a.partitions for p in ids} for m, a in result.items()}


def test_range_gives_the_first_members_one_more_in_member_id_order() -> None:
    subs = {m: Subscription(("t",)) for m in ("c", "a", "b")}
    result = range_assign(subs, {"t": 7})
    assert {m: a.partitions for m, a in result.items()} == {
        "a": (("t", (0, 1, 2)),), "b": (("t", (3, 4)),), "c": (("t", (5, 6)),)}


def test_range_leaves_members_without_partitions_when_there_are_more_members() -> None:
    result = range_assign({m: Subscription(("t",)) for m in "abc"}, {"t": 2})
    assert counts(result) == {"a": 1, "b": 1, "c": 0}


def test_cooperative_sticky_withholds_a_moving_partition_for_one_round() -> None:
    # a owned everything; b joins: a keeps 2, gives up 2 which nobody gets this round
    subs = {"a": Subscription(("t",), owned_partitions=(("t", (0, 1, 2, 3)),), generation_id=1),
            "b": Subscription(("t",))}
    first = cooperative_sticky_assign(subs, {"t": 4})
    assert counts(first) == {"a": 2, "b": 0}
    gone = revoked(subs["a"].owned_partitions, first["a"].partitions)
    assert sum(len(ids) for _t, ids in gone) == 2
    # a rejoins owning only its 2: b gets the other 2, a keeps its own
    subs["a"] = Subscription(("t",), owned_partitions=first["a"].partitions, generation_id=2)
    second = cooperative_sticky_assign(subs, {"t": 4})
    assert counts(second) == {"a": 2, "b": 2}
    assert second["a"].partitions == first["a"].partitions


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 30), st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=8,
                                    unique=True), st.randoms(use_true_random=False))
def test_cooperative_sticky_converges_balanced_with_one_owner(partitions: int, members: list[str], rnd) -> None:  # type: ignore[no-untyped-def]
    ownership: dict[str, tuple] = {}
    for member in members:  # a random previous ownership (each partition at most once)
        ownership[member] = ()
    for p in range(partitions):
        if rnd.random() < 0.7:
            m = rnd.choice(members)
            ownership[m] = (("t", tuple(sorted({*dict(ownership[m]).get("t", ()), p}))),)
    for _round in range(3):
        subs = {m: Subscription(("t",), owned_partitions=ownership[m]) for m in members}
        result = assign("cooperative-sticky", subs, {"t": partitions})
        sets = owned(result)
        all_assigned = [tp for s in sets.values() for tp in s]
        assert len(all_assigned) == len(set(all_assigned))  # never two owners
        for m in members:  # nothing is given to a member while another member still owns it
            others = {tp for o in members if o != m for _t, ids in ownership[o] for tp in [("t", p) for p in ids]}
            assert not (sets[m] - {("t", p) for _t, ids in ownership[m] for p in ids}) & others
        ownership = {m: result[m].partitions for m in members}
    final = counts(result)
    assert sum(final.values()) == partitions
    assert max(final.values()) - min(final.values()) <= 1
