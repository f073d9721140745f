"""How the coordinator announces what happens to groups.

The event topic, tracing and metrics implement `GroupObserver`; group logic only ever calls it (through
`ObserverMux` when there are several) and never imports them. Observers run synchronously on the event loop:
keep them cheap and non-blocking. A raising observer is logged and ignored; it never breaks group logic.
"""
from __future__ import annotations

import logging

log = logging.getLogger("coordinator.group.observer")


class GroupObserver:
    """No-op base: override what you need."""

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

    def on_rebalance_started(self, group_id: str, generation: int, reason: str) -> None:
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
        pass


_EVENTS = [name for name in vars(GroupObserver) if name.startswith("on_")]


class ObserverMux(GroupObserver):
    """Fans every event out to several observers, isolating their failures."""

    def __init__(self, *observers: GroupObserver) -> None:
        self.observers = list(observers)

    def add(self, observer: GroupObserver) -> None:
        self.observers.append(observer)


def _fan_out(event: str):
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
