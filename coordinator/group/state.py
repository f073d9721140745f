"""The classic group state machine as data (Kafka 3.9 `GroupMetadata.scala`).

Each state's docstring has an `action:` part (how requests are answered in it) and a `transition:` part (which
event moves it where). `VALID_PREVIOUS` is the only definition of the legal moves; predicates derive from it.
"""
from __future__ import annotations

from enum import Enum


class GroupState(Enum):
    EMPTY = "Empty"
    """Group has no more members, but lingers until all offsets have expired. This state also represents
    groups which use Kafka only for offset commits and have no members.

    action: respond normally to join group from new members; respond to sync group with UNKNOWN_MEMBER_ID;
            respond to heartbeat with UNKNOWN_MEMBER_ID; respond to leave group with UNKNOWN_MEMBER_ID;
            respond to offset commit with generation -1 (and no member) normally; allow offset fetch.
    transition: member joins => PreparingRebalance (InitialDelayedJoin);
                all offsets removed and group is Empty => Dead; DeleteGroups => Dead; unload => Dead.
    """

    PREPARING_REBALANCE = "PreparingRebalance"
    """Group is preparing to rebalance.

    action: respond to heartbeats with REBALANCE_IN_PROGRESS; respond to sync group with REBALANCE_IN_PROGRESS;
            park join group requests from new or existing members until all expected members have joined;
            allow offset commits from members of the previous generation; allow offset fetch.
    transition: some members have joined by the timeout => CompletingRebalance;
                all members have left the group => Empty; unload => Dead.
    """

    COMPLETING_REBALANCE = "CompletingRebalance"
    """Group is awaiting the state assignment from the leader.

    action: respond to heartbeats with NONE (Kafka's comments say REBALANCE_IN_PROGRESS; its code says NONE);
            respond to offset commits with REBALANCE_IN_PROGRESS; park sync group requests from followers until
            the leader's assignment is stored; answer a join with unchanged metadata with the current generation.
    transition: leader's assignment stored => Stable; join with new metadata, member failure or leave, store
                failure => PreparingRebalance; unload => Dead.
    """

    STABLE = "Stable"
    """Group is stable.

    action: respond to member heartbeats normally; answer sync group with the stored assignment;
            answer a follower's join with unchanged metadata with the current generation;
            allow offset commits from members of the current generation; allow offset fetch.
    transition: member failure detected via heartbeat => PreparingRebalance;
                leave group from an existing member => PreparingRebalance;
                leader join group => PreparingRebalance; follower join group with new metadata =>
                PreparingRebalance; pending-sync expiry => PreparingRebalance; unload => Dead.
    """

    DEAD = "Dead"
    """Group has no more members and its metadata is being removed.

    action: respond to join group with UNKNOWN_MEMBER_ID (new members: COORDINATOR_NOT_AVAILABLE);
            respond to sync group, heartbeat, leave group and offset commit with COORDINATOR_NOT_AVAILABLE;
            answer offset fetch as for an unknown group.
    transition: Dead is a final state before the group is removed from the coordinator.
    """

    @property
    def lower_name(self) -> str:
        return self.value.lower()


S = GroupState
# The short names group logic uses.
EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    S.EMPTY, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.STABLE, S.DEAD)
VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    S.PREPARING_REBALANCE: frozenset({S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY}),
    S.COMPLETING_REBALANCE: frozenset({S.PREPARING_REBALANCE}),
    S.STABLE: frozenset({S.COMPLETING_REBALANCE}),
    S.EMPTY: frozenset({S.PREPARING_REBALANCE}),
    S.DEAD: frozenset({S.STABLE, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD}),
}


class IllegalStateTransition(RuntimeError):
    def __init__(self, group_id: str, current: GroupState, target: GroupState) -> None:
        expected = sorted(s.value for s in VALID_PREVIOUS[target])
        super().__init__(
            f"Group {group_id} should be in one of {expected} states before moving to {target.value} state. "
            f"Instead it is in {current.value} state"
        )
        self.group_id, self.current, self.target = group_id, current, target
