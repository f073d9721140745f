"""A steady heartbeat answered again: what the group logic's steady shortcut (heartbeat.steady_heartbeat) answered a
member from, kept for that member's next steady heartbeats (the connection's steady path keeps it with the answer's
bytes, handlers/consumer_group_heartbeat.py), and the one check that none of it changed.

While `renew` holds, the shortcut would give the same answer (no error, the member's id and epoch, the group's
heartbeat interval, no assignment) and its only effect would be the session deadline moved: `renew` does just that.
It does not hold, and the heartbeat goes to the shortcut or the general path (which decide, with Kafka's errors),
once any of these changed:
  - the member: any field, its epoch, its state or assignment (members are immutable: a change is a new object),
    or it left or was fenced (its session timer is not live any more);
  - the group: its epoch or its assignment epoch (a target to compute), a member subscribed by regular expression,
    the group replaced or unloaded, the shard not active, a classic group of that id to convert;
  - a write of the group is not acknowledged yet, the group's configuration changed (its session timeout or
    interval; read again with the same values, it still holds) or is not known any more, or the shortcut is
    switched off;
  - the subscribed topics, looked at again once the group's metadata refresh deadline is reached (as the shortcut
    looks: the runtime's check that each is known, stale ones refreshed in the background, then their metadata
    hash), changed or are not all known.
The request itself is the same bytes, so its fields (all after the epoch null), client id and host are too.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from coordinator.group.modern.conversion import is_convertible
from coordinator.group.modern.group import ConsumerGroup
from coordinator.group.modern.group_configs import GroupConfig
from coordinator.group.modern.heartbeat import topics_unchanged
from coordinator.group.modern.member import ConsumerGroupMember
from coordinator.group.status import ShardStatus

if TYPE_CHECKING:
    from coordinator.group.modern.service import ConsumerGroupService, SessionTimer
    from coordinator.group.shard import GroupShard

_ACTIVE = ShardStatus.ACTIVE


class SteadyMember:
    """A member's steady answer as the shortcut computed it, valid while `renew` says so."""

    __slots__ = ("service", "shard", "group", "member", "group_id", "member_id", "group_epoch", "assignment_epoch",
                 "config", "session", "_topics_ready", "_now_ms")

    def __init__(self, service: ConsumerGroupService, shard: GroupShard, group: ConsumerGroup,
                 member: ConsumerGroupMember, config: GroupConfig, session: SessionTimer,
                 topics_ready: Callable[[Collection[str]], bool]) -> None:
        self.service = service
        self.shard, self.group, self.member = shard, group, member
        self.group_id, self.member_id = group.group_id, member.member_id
        self.group_epoch, self.assignment_epoch = group.group_epoch, group.assignment_epoch
        self.config = config
        self.session = session
        self._topics_ready = topics_ready  # the runtime's: every subscribed topic known (stale ones refreshed)
        self._now_ms = service.timer.clock.now_ms

    @property
    def member_epoch(self) -> int:
        return self.member.member_epoch

    @property
    def heartbeat_interval_ms(self) -> int:
        return self.config.heartbeat_interval_ms

    def renew(self) -> bool:
        """True: the member's heartbeat now is answered as before, its session deadline moved (and, when due, the
        group's topics looked at again, as the shortcut does); False: nothing of the group was changed (the shortcut
        or the general path serves the heartbeat)."""
        now_ms = self._now_ms()
        group, shard, group_id, service = self.group, self.shard, self.group_id, self.service
        if (shard.status is not _ACTIVE or shard.consumer_groups.get(group_id) is not group
                or group.members.get(self.member_id) is not self.member or not self.session.live
                or group.group_epoch != self.group_epoch or group.assignment_epoch != self.assignment_epoch
                or group.has_regex_subscribers() or not service.steady_shortcut
                or service.unacknowledged(group_id)[0] is not None):
            return False
        classic = shard.groups.get(group_id)
        if classic is not None and is_convertible(classic):
            return False
        config = service.group_configs.get(group_id, now_ms)  # as the shortcut: read again in the background if due
        if config is not self.config:
            kept = self.config
            if (config.session_timeout_ms != kept.session_timeout_ms
                    or config.heartbeat_interval_ms != kept.heartbeat_interval_ms
                    or not service.group_configs.known(group_id)):
                return False
            self.config = config  # read again, the same values
        if now_ms >= group.metadata_refresh_deadline_ms and not (
                self._topics_ready(group.topic_names())
                and topics_unchanged(group, service.topics, service.settings.metadata_refresh_interval_ms, now_ms)):
            return False
        self.session.move(now_ms)
        return True
