"""What must hold of every group and between groups after any step: member counts, leader, static members,
pending members, protocol votes, and the state each of them allows."""
from __future__ import annotations

from coordinator.group.metadata import GroupMetadata
from coordinator.group.state import GroupState
from tests.support.group_harness import Env


def check_invariants(env: Env) -> None:
    seen: dict[str, str] = {}
    for group_id, group in env.coordinator.groups.items():
        check_group(group)
        for member_id in group.members:
            assert member_id not in seen, f"member {member_id} in {seen.get(member_id)} and {group_id}"
            seen[member_id] = group_id


def check_group(group: GroupMetadata) -> None:
    members = group.members
    assert group.num_members_awaiting_join == sum(1 for m in members.values() if m.is_awaiting_join)
    assert (group.leader_id in members) if members else group.leader_id is None
    assert all(members[mid].group_instance_id == iid for iid, mid in group.static_members.items())
    assert len(group.static_members) == sum(1 for m in members.values() if m.is_static)
    assert not (group.pending_members & set(members))
    # A static member replaced before its old id synced leaves that id pending (Kafka 3.9 does the same), so
    # pending-sync ids need not be members; but they only exist between a join response and Stable's end.
    if group.state in (GroupState.PREPARING_REBALANCE, GroupState.EMPTY):
        assert not group.pending_sync_members
    for name, count in group.supported_protocols.items():
        assert count == sum(1 for m in members.values() if name in m.protocol_names)
    if group.state is GroupState.EMPTY:
        assert not members
    if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
        assert members and group.protocol_name is not None
