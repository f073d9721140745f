"""The owner map's merging: a description of the instances group + our own assignment → partition owners."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
from confluent_kafka import TopicPartition

from coordinator.cluster.directory import OwnerMapDirectory
from coordinator.cluster.identity import InstanceEndpoint, client_id_for
from coordinator.cluster.owner_map import Described, DescribedMember, OwnerMap, described_members, merge
from coordinator.group.partitioner import partition_for

TOPIC = "__coordinator_state"
A = InstanceEndpoint("a", 2_000_000_101, "127.0.0.1", 9101)
B = InstanceEndpoint("b", 2_000_000_102, "127.0.0.1", 9102)
C = InstanceEndpoint("c", 2_000_000_103, "127.0.0.1", 9103)


def member(endpoint: InstanceEndpoint, partitions: tuple[int, ...] | None, member_id: str | None = None
           ) -> DescribedMember:
    return DescribedMember(member_id or f"{endpoint.instance_id}-m", client_id_for(endpoint), partitions)


def described(*members: DescribedMember, stable: bool = True) -> Described:
    return Described(tuple(members), stable)


def test_a_stable_description_names_every_owner_and_instance() -> None:
    view, remembered = merge(described(member(A, (0, 1)), member(B, (2, 3)), member(C, (4,))), {}, A, {0, 1}, 6)
    assert view.owners == {0: A, 1: A, 2: B, 3: B, 4: C}
    assert view.instances == (A, B, C)
    assert remembered == {"a-m": (0, 1), "b-m": (2, 3), "c-m": (4,)}


def test_our_own_assignment_wins_over_an_older_description() -> None:
    # Kafka still says B holds 2 and we hold 0, but the membership callbacks already gave us 2 and took 0
    view, _ = merge(described(member(A, (0, 1)), member(B, (2, 3))), {}, A, {1, 2}, 4)
    assert view.owners == {1: A, 2: A, 3: B}
    assert view.owners.get(0) is None  # revoked from us, new owner not described yet: unknown


def test_a_partition_claimed_twice_has_no_owner() -> None:
    view, _ = merge(described(member(B, (2, 3)), member(C, (3, 4))), {}, A, set(), 6)
    assert view.owners == {2: B, 4: C}
    assert view.contested == {3}


def test_during_a_rebalance_members_keep_their_last_assignment() -> None:
    _, remembered = merge(described(member(A, (0,)), member(B, (1, 2))), {}, A, {0}, 4)
    # Kafka describes a rebalancing group's members without assignments; C is new, nothing known of it yet
    view, remembered = merge(described(member(A, None), member(B, None), member(C, None), stable=False),
                             remembered, A, {0}, 4)
    assert view.owners == {0: A, 1: B, 2: B}
    assert view.instances == (A, B, C)
    assert remembered["c-m"] == ()


def test_a_member_gone_from_the_group_owns_nothing() -> None:
    _, remembered = merge(described(member(A, (0,)), member(B, (1, 2))), {}, A, {0}, 4)
    view, _ = merge(described(member(A, None), stable=False), remembered, A, {0}, 4)
    assert view.owners == {0: A}
    assert view.instances == (A,)


def test_foreign_members_and_out_of_range_partitions_are_ignored() -> None:
    foreign = DescribedMember("tool-m", "kafka-consumer-groups", (1,))
    view, _ = merge(described(foreign, member(B, (2, 99))), {}, A, set(), 4)
    assert view.owners == {2: B}
    assert view.instances == (A, B)


def test_we_are_always_an_instance_even_before_joining() -> None:
    view, _ = merge(described(), {}, A, set(), 4)
    assert (view.owners, view.instances) == ({}, (A,))


def test_two_instances_with_one_node_id_are_a_clash() -> None:
    twin = InstanceEndpoint("b-twin", B.node_id, "127.0.0.1", 9202)
    view, _ = merge(described(member(B, (1,)), member(twin, (2,))), {}, A, set(), 4)
    assert view.node_id_clashes == ((B, twin),)
    # an earlier incarnation of the same instance (same endpoint, old member id) is no clash
    view, _ = merge(described(member(B, (1,), "old"), member(B, (2,), "new")), {}, A, set(), 4)
    assert view.node_id_clashes == () and view.instances == (A, B)


def test_a_confluent_description_is_reduced_to_the_state_topic() -> None:
    def desc(state: str, assignment: list[TopicPartition] | None) -> SimpleNamespace:
        m = SimpleNamespace(member_id="m1", client_id=client_id_for(B),
                            assignment=SimpleNamespace(topic_partitions=assignment))
        return SimpleNamespace(state=SimpleNamespace(name=state), members=[m])

    stable = described_members(desc("STABLE", [TopicPartition(TOPIC, 3), TopicPartition("other", 1),
                                               TopicPartition(TOPIC, 0)]), TOPIC)
    assert stable == Described((DescribedMember("m1", client_id_for(B), (0, 3)),), True)
    assert described_members(desc("STABLE", []), TOPIC).members[0].partitions == ()
    assert described_members(desc("PREPARING_REBALANCE", []), TOPIC).members[0].partitions is None


async def test_the_map_applies_descriptions_and_own_assignments_on_the_loop(caplog: pytest.LogCaptureFixture
                                                                            ) -> None:
    owner_map = OwnerMap("127.0.0.1:1", "instances", TOPIC, 4, A)  # never started: nothing to reach
    owner_map.set_own({0})
    assert owner_map.owner(0) == A and owner_map.instances() == [A]
    twin = InstanceEndpoint("b-twin", B.node_id, "127.0.0.1", 9202)
    with caplog.at_level(logging.INFO, logger="coordinator.cluster"):
        owner_map._apply(described(member(A, (0,)), member(B, (1, 2)), member(twin, (3,))))
    assert [owner_map.owner(p) for p in range(4)] == [A, B, B, twin]
    assert [r.levelname for r in caplog.records if "node_id_clash" in r.message] == ["ERROR"]
    await asyncio.to_thread(owner_map.set_own, {0, 1})  # from the membership consumer's thread: applied on the loop
    await asyncio.sleep(0)
    assert owner_map.owner(1) == A


def test_the_directory_routes_a_group_to_the_owner_of_its_partition() -> None:
    owners = {partition_for("orders", 4): B}
    directory = OwnerMapDirectory(4, "cluster-x")
    assert directory.coordinator_node("orders") is None and directory.nodes() == []  # no map yet: nobody known
    directory.attach(SimpleNamespace(owner=owners.get, instances=lambda: [A, B]))
    node = directory.coordinator_node("orders")
    assert node is not None and (node.node_id, node.host, node.port, node.cluster_id) == (
        B.node_id, B.host, B.port, "cluster-x")
    other = next(g for g in ("a", "b", "c", "d", "e") if partition_for(g, 4) != partition_for("orders", 4))
    assert directory.coordinator_node(other) is None
    assert [n.node_id for n in directory.nodes()] == [A.node_id, B.node_id]
    assert directory.coordinator_node("orders") is node  # one Node per endpoint


def test_a_failing_refresh_keeps_the_map_and_warns_once_it_persists(caplog: pytest.LogCaptureFixture) -> None:
    owner_map = OwnerMap("127.0.0.1:1", "instances", TOPIC, 4, A)
    owner_map._apply(described(member(A, (0,)), member(B, (1,))))
    failures = iter([RuntimeError("Kafka unreachable")] * 4)

    def describe() -> Described:
        raise next(failures)

    owner_map._describe = describe  # type: ignore[method-assign]
    with caplog.at_level(logging.DEBUG, logger="coordinator.cluster"):
        for _ in range(4):
            owner_map._refresh_once()
    assert [r.levelname for r in caplog.records if "refresh_failed" in r.message] == [
        "DEBUG", "DEBUG", "WARNING", "DEBUG"]
    assert owner_map.owner(1) == B  # the last map stands
