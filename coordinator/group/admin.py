"""DescribeGroups (§3.7), ListGroups (§3.8), DeleteGroups (§3.9): mixed into GroupCoordinator."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from coordinator.group.api import (DeletableGroupResult, DeleteGroupsRequest, DeleteGroupsResponse,
                                   DescribedGroup, DescribedGroupMember, DescribeGroupsRequest,
                                   DescribeGroupsResponse, ListedGroup, ListGroupsRequest, ListGroupsResponse)
from protocol.error_codes import Errors
from coordinator.group.state import GroupState

if TYPE_CHECKING:
    from coordinator.group.coordinator import GroupCoordinator
    from coordinator.group.metadata import GroupMetadata

log = logging.getLogger("coordinator.group")

CLASSIC = "classic"


class AdminHandlers:
    async def describe_groups(self: GroupCoordinator, req: DescribeGroupsRequest) -> DescribeGroupsResponse:
        return DescribeGroupsResponse([self.describe_group(group_id, req.version) for group_id in req.groups])

    def describe_group(self: GroupCoordinator, group_id: str, version: int = 5) -> DescribedGroup:
        error = self.group_status_error(group_id, empty_id_ok=True)
        if error is not None:
            return DescribedGroup(error, group_id)
        group = self.groups.get(group_id)
        if group is None:
            # v6 (Kafka 4.0, KIP-1043) reports the unknown group; older versions describe it as Dead.
            error = Errors.GROUP_ID_NOT_FOUND if version >= 6 else Errors.NONE
            return DescribedGroup(error, group_id, group_state=GroupState.DEAD.value)
        return self._summary(group)

    @staticmethod
    def _summary(group: GroupMetadata) -> DescribedGroup:
        stable = group.is_in(GroupState.STABLE)
        protocol = group.protocol_name if stable else None
        members = [
            DescribedGroupMember(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.metadata(protocol) if protocol is not None else b"",
                m.assignment if stable else b"")
            for m in group.members.values()
        ]
        return DescribedGroup(Errors.NONE, group.group_id, group.state.value, group.protocol_type or "",
                              protocol or "", members)

    async def list_groups(self: GroupCoordinator, req: ListGroupsRequest) -> ListGroupsResponse:
        if not self.is_active:
            return ListGroupsResponse(Errors.COORDINATOR_NOT_AVAILABLE)
        error = Errors.COORDINATOR_LOAD_IN_PROGRESS if self.is_loading else Errors.NONE
        states = {s.lower() for s in req.states_filter}
        types_ok = not req.types_filter or any(t.lower() == CLASSIC for t in req.types_filter)
        groups = [
            ListedGroup(g.group_id, g.protocol_type or "", g.state.value, CLASSIC)
            for g in self.groups.values()
            if types_ok and (not states or g.state.lower_name in states)
        ]
        return ListGroupsResponse(error, groups)

    async def delete_groups(self: GroupCoordinator, req: DeleteGroupsRequest) -> DeleteGroupsResponse:
        results: dict[str, Errors] = {}
        eligible: list[GroupMetadata] = []
        for group_id in dict.fromkeys(req.groups_names):  # de-duplicated, request order kept
            error = self.group_status_error(group_id, empty_id_ok=True)
            group = self.groups.get(group_id)
            if error is not None:
                results[group_id] = error
            elif group is None or group.is_in(GroupState.DEAD):
                results[group_id] = Errors.GROUP_ID_NOT_FOUND
            elif group.is_in(GroupState.EMPTY):
                group.transition_to(GroupState.DEAD, self.now_wall_ms())
                eligible.append(group)
                results[group_id] = Errors.NONE
            else:
                results[group_id] = Errors.NON_EMPTY_GROUP
        if eligible:
            removed = await self.cleanup_groups(eligible, lambda g: g.remove_offsets(list(g.offsets)))
            log.info("event=groups_deleted groups=%s offsets_removed=%d", [g.group_id for g in eligible], removed)
        return DeleteGroupsResponse([DeletableGroupResult(g, e) for g, e in results.items()])
