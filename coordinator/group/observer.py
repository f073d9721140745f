"""How the coordinator announces what happens to groups.

The event topic, tracing and metrics implement `GroupObserver`; group logic only ever calls it (through
`ObserverMux` when there are several) and never imports them. Observers run synchronously on the event loop:
keep them cheap and non-blocking. A raising observer is logged and ignored; it never breaks group logic.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from coordinator.group.records import Record

log = logging.getLogger("coordinator.group.observer")


class RebalanceCategory(Enum):
    """Why a rebalance started, as a low-cardinality name (metrics label, span attribute)."""

    MEMBER_JOINED = "member_joined"  # a new member id joined
    MEMBER_REJOINED = "member_rejoined"  # a known member joined again while the group was preparing
    METADATA_CHANGED = "metadata_changed"  # a known member joined with other protocols
    LEADER_REJOINED = "leader_rejoined"  # the leader of a Stable group joined again
    STATIC_MEMBER = "static_member"  # a static member came back with a new member id and other protocols
    MEMBER_LEFT = "member_left"  # LeaveGroup
    SESSION_TIMEOUT = "session_timeout"  # a member's session expired
    SYNC_TIMEOUT = "sync_timeout"  # members sent no SyncGroup within the rebalance timeout
    ASSIGNMENT_STORE_FAILED = "assignment_store_failed"  # the leader's assignment could not be written
    OVER_CAPACITY = "over_capacity"  # a loaded group has more members than group.max.size
    # consumer groups (KIP-848): what bumped the group epoch besides a join, a leave or a session expiry
    REBALANCE_TIMEOUT = "rebalance_timeout"  # fenced: partitions not revoked (or not rejoined) within its timeout
    SUBSCRIPTION_CHANGED = "subscription_changed"  # a member subscribed to other topics or another regex
    REGEX_RESOLVED = "regex_resolved"  # a regular expression now matches other topics
    TOPIC_METADATA_CHANGED = "topic_metadata_changed"  # a subscribed topic was created, deleted or grew


@dataclass(frozen=True, slots=True)
class RebalanceCause:
    """What started a rebalance: `category`, the member it is about (None for several or none),
    `client_reason` (the JoinGroup/LeaveGroup reason the client gave, if any) and `text`, Kafka's own reason
    as it logs it ("Adding new member ... client reason: ...")."""

    category: RebalanceCategory
    text: str
    member_id: str | None = None
    client_reason: str | None = None


@dataclass(frozen=True, slots=True)
class ConsumerRebalance:
    """A consumer group's group epoch bump (KIP-848): a rebalance towards a new target assignment. `text` of the
    cause is Kafka's own log line for it."""

    group_epoch: int
    previous_epoch: int
    cause: RebalanceCause
    member_count: int


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """One consumer group member's move towards its target, as one heartbeat (or JoinGroup) made it: `steps` of
    RECONCILIATION_STEPS in order; partition counts after the move."""

    member_id: str
    steps: tuple[str, ...]
    member_epoch: int
    previous_epoch: int
    target_epoch: int
    assigned: int
    revoking: int
    added: int  # partitions this move delivered


# The steps of a member's reconciliation (Kafka's CurrentAssignmentBuilder states), in the order they happen.
REVOCATION_REQUESTED = "revocation requested"  # UNREVOKED_PARTITIONS: told to give partitions up first
REVOKED = "partitions revoked"  # it reported them gone
WAITING_FOR_PARTITIONS = "waiting for partitions"  # UNRELEASED_PARTITIONS: others still hold some of its target
ASSIGNED = "assignment delivered"  # partitions added to its assignment
EPOCH_REACHED = "epoch reached"  # STABLE at the target epoch
RECONCILIATION_STEPS = (REVOCATION_REQUESTED, REVOKED, WAITING_FOR_PARTITIONS, ASSIGNED, EPOCH_REACHED)


class GroupObserver:
    """No-op base: override what you need."""

    # Whether `on_join_waiting` and `on_sync_waiting` are to be called: one call per member and request of a
    # rebalance (2,000 at 1,000 members), which group logic skips when the observer says it does nothing with
    # them (ObserverMux: none of its observers overrides either). Any other observer is called.
    waits_watched = True

    def on_state_change(self, group_id: str, old_state: str, new_state: str, generation: int) -> None:
        pass

    def on_member_joined(
        self, group_id: str, member_id: str, group_instance_id: str | None, client_id: str, client_host: str
    ) -> None:
        """A member was added to the group (a new member id, including a static member's first join)."""

    def on_member_replaced(
        self, group_id: str, old_member_id: str, new_member_id: str, group_instance_id: str
    ) -> None:
        """A static member rejoined with a new member id; the old id is fenced."""

    def on_member_left(self, group_id: str, member_id: str, group_instance_id: str | None, reason: str) -> None:
        """A member left on purpose (LeaveGroup)."""

    def on_member_failed(
        self, group_id: str, member_id: str, group_instance_id: str | None, reason: str
    ) -> None:
        """A member was removed by the coordinator: session expiry, no rejoin, no sync, capacity."""

    def on_rebalance_starting(self, group_id: str, generation: int, cause: RebalanceCause) -> None:
        """A rebalance is about to start for `cause`: called before the events of its cause (the member that
        joined, left or failed) and before the group enters PreparingRebalance; once per rebalance (a second
        call for the same one, from prepare_rebalance, repeats the first)."""

    def on_rebalance_started(self, group_id: str, generation: int, cause: RebalanceCause) -> None:
        """The group entered PreparingRebalance; `generation` is the old generation."""

    def on_rebalance_completed(self, group_id: str, generation: int, member_count: int, duration_ms: int) -> None:
        """The group reached Stable (or Empty) with this generation; duration since the rebalance started."""

    def on_join_waiting(self, group_id: str, member_id: str) -> None:
        """A member's JoinGroup is parked until the join phase completes (also a re-sent one)."""

    def on_join_completed(self, group_id: str, generation: int, protocol_name: str | None, leader_id: str | None,
                          member_count: int) -> None:
        """The join phase ended: the new generation (Empty when nobody joined), its protocol and leader."""

    def on_sync_waiting(self, group_id: str, member_id: str) -> None:
        """A member's SyncGroup is parked until the leader's assignment is stored."""

    def on_assignment_write_started(self, group_id: str, generation: int) -> None:
        """The leader's assignment is being appended to the state topic."""

    def on_assignment_write_completed(self, group_id: str, generation: int, error: str) -> None:
        """The append of that assignment finished; `error` is "NONE" or the Kafka error name."""

    def on_member_session_expired(self, group_id: str, member_id: str, client_id: str, client_host: str,
                                  session_timeout_ms: int, since_last_heartbeat_ms: int) -> None:
        """Called just before `on_member_failed` for a session expiry, with what explains it."""

    def on_rebalance_in_progress(self, group_id: str, member_id: str, api: str) -> None:
        """A request (Heartbeat, SyncGroup) was answered REBALANCE_IN_PROGRESS."""

    def on_offsets_committed(self, group_id: str, member_id: str, partition_count: int) -> None:
        pass

    def on_offsets_expired(self, group_id: str, partition_count: int) -> None:
        """Offsets removed by the retention check."""

    def on_offsets_deleted(self, group_id: str, partition_count: int) -> None:
        """Offsets removed by OffsetDelete."""

    def on_group_deleted(self, group_id: str, partition_count: int) -> None:
        """The group was removed by DeleteGroups, with `partition_count` offsets."""

    def on_append_completed(self, group_id: str, partition: int, records: Sequence[Record], duration_ms: float,
                            error: str, by_request: bool) -> None:
        """An append to the state topic was acknowledged (`error` "NONE") or failed (the Kafka error name), after
        `duration_ms`; `by_request`: made by a request's handler, else by group logic on its own (a timer)."""

    # --- consumer groups (KIP-848): the same life, told by group epochs ---------------------------------------
    def on_consumer_member_joined(self, group_id: str, member_id: str, group_instance_id: str | None,
                                  client_id: str, client_host: str, protocol: str) -> None:
        """A new member id in a consumer group; `protocol`: "consumer", or "classic" for a JoinGroup member."""

    def on_consumer_member_replaced(self, group_id: str, old_member_id: str, new_member_id: str,
                                    group_instance_id: str) -> None:
        """A static member rejoined with a new member id and took its predecessor's place."""

    def on_consumer_member_left(self, group_id: str, member_id: str, group_instance_id: str | None,
                                reason: str) -> None:
        """A member left on purpose (heartbeat with epoch -1, LeaveGroup); `reason` is Kafka's line."""

    def on_consumer_member_failed(self, group_id: str, member_id: str, group_instance_id: str | None,
                                  reason: str, category: RebalanceCategory) -> None:
        """A member fenced by a timer; `reason` is Kafka's line ("Member X fenced from the group because ...")."""

    def on_consumer_rebalance_started(self, group_id: str, rebalance: ConsumerRebalance) -> None:
        """The group epoch was bumped (after the events of its cause); a rebalance still under way is superseded."""

    def on_consumer_target_assigned(self, group_id: str, assignment_epoch: int, member_count: int,
                                    changed_members: int, assignor: str) -> None:
        """A new target assignment was computed for `assignment_epoch`; `changed_members` got another target."""

    def on_consumer_member_reconciled(self, group_id: str, reconciliation: Reconciliation) -> None:
        """A member's current assignment moved (record 8 written for it)."""

    def on_consumer_rebalance_resumed(self, group_id: str, group_epoch: int, member_count: int) -> None:
        """A group loaded here (a restart, a failover) in the middle of a rebalance: its end is told here, its
        start was told by the instance that had the group."""

    def on_consumer_rebalance_completed(self, group_id: str, group_epoch: int, member_count: int,
                                        duration_ms: int | None) -> None:
        """Every member reached the target of `group_epoch` (or none is left); duration since the bump (None for a
        resumed rebalance: its start was another instance's)."""

    def on_consumer_rebalance_abandoned(self, group_id: str, group_epoch: int, reason: str) -> None:
        """The group left this instance (unloaded) or was deleted while a rebalance was under way."""

    def on_consumer_rebalance_converted(self, group_id: str, group_epoch: int) -> None:
        """The group was converted to a classic group while a rebalance was under way: not a failure, the
        classic group's rebalance (caused by the conversion) carries it on."""

    def on_group_converted(self, group_id: str, protocol: str, generation: int, state: str) -> None:
        """The group id changes type: `protocol` "consumer" (an online upgrade; the classic group goes Dead next,
        unloaded; or a failed downgrade's classic group undone) or "classic" (a downgrade, or a failed upgrade's
        classic group restored), the classic group then in `state` at `generation` (no state change is reported
        for it: it is made in that state). Its generations go on from the other type's epochs: not a new group."""

    def on_group_replaced(self, group_id: str, protocol: str) -> None:
        """An Empty group of the other type gave way to a new group of type `protocol` ("classic": a JoinGroup;
        "consumer": a ConsumerGroupHeartbeat), as Kafka replaces an empty group: its generations (epochs) start
        again from the beginning."""

    def on_txn_offsets_pending(self, group_id: str, transactional_id: str, producer_id: int, producer_epoch: int,
                               partition_count: int) -> None:
        """A TxnOffsetCommit's offsets are in the state partition, pending until their transaction's marker."""

    def on_txn_offsets_settled(self, producer_id: int, producer_epoch: int, committed: bool,
                               offset_count: int) -> None:
        """The transaction coordinator's COMMIT (`committed`) or ABORT marker settled a producer's pending offsets;
        `offset_count` of them became current."""

    def on_txn_group_offsets_settled(self, group_id: str, transactional_id: str | None, producer_id: int,
                                     producer_epoch: int, committed: bool, partition_count: int,
                                     first_pending_ms: int | None) -> None:
        """Per group of a settled transaction: its `partition_count` pending offsets were committed or aborted;
        `first_pending_ms` the earliest commit time among them (from the log: known after a failover too);
        `transactional_id` None where this instance did not serve the transaction's TxnOffsetCommit."""


_EVENTS = [name for name in vars(GroupObserver) if name.startswith("on_")]


class ObserverMux(GroupObserver):
    """Fans every event out to several observers, isolating their failures."""

    def __init__(self, *observers: GroupObserver) -> None:
        self.observers = list(observers)
        self.waits_watched = any(_watches_waits(observer) for observer in self.observers)

    def add(self, observer: GroupObserver) -> None:
        self.observers.append(observer)
        self.waits_watched = self.waits_watched or _watches_waits(observer)


def _watches_waits(observer: GroupObserver) -> bool:
    """The observer does something with a parked member's wait (its class overrides either event, or says so)."""
    kind = type(observer)
    return (observer.waits_watched and (kind.on_join_waiting is not GroupObserver.on_join_waiting
                                        or kind.on_sync_waiting is not GroupObserver.on_sync_waiting))


def _fan_out(event: str) -> Callable[..., None]:
    def call(self: ObserverMux, *args: object) -> None:
        for observer in self.observers:
            try:
                getattr(observer, event)(*args)
            except Exception:
                log.exception("event=observer_failed observer=%s callback=%s", type(observer).__name__, event)

    call.__name__ = event
    return call


for _event in _EVENTS:
    setattr(ObserverMux, _event, _fan_out(_event))
