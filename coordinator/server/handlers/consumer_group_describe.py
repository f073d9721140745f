"""ConsumerGroupDescribe (69): groups of the KIP-848 protocol with their epochs, members and assignments. v1 adds
each member's type (KIP-1099). Authorized operations are not computed here: INT32_MIN (not asked for) is sent."""

from __future__ import annotations

from typing import Any

from coordinator.group.modern.service import DescribedGroup, DescribedPartitions
from coordinator.security.authorizer import Operation, ResourceType
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.error_codes import Errors
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY = ApiKey.CONSUMER_GROUP_DESCRIBE
VERSIONS = (0, 1)
_NOT_ASKED = -2_147_483_648
_TOPICS_REFUSED = "The group has described topic(s) that the client is not authorized to describe."


def to_response(version: int, groups: list[DescribedGroup], operations: dict[str, int] | None = None) -> Any:
    cls = response_class(API_KEY, version)
    group_class = item_class(cls, "groups")
    member_class = item_class(group_class, "members")
    assignment_class = item_class(member_class, "assignment")
    partitions_class = item_class(assignment_class, "topic_partitions")

    def assignment(partitions: tuple[DescribedPartitions, ...]) -> Any:
        return assignment_class(topic_partitions=tuple(
            partitions_class(topic_id=p.topic_id, topic_name=p.topic_name, partitions=p.partitions)
            for p in partitions))

    described = tuple(
        build(group_class, error_code=error(g.error), error_message=g.message, group_id=g.group_id,
              group_state=g.state, group_epoch=g.group_epoch, assignment_epoch=g.assignment_epoch,
              assignor_name=g.assignor_name, authorized_operations=(operations or {}).get(g.group_id, _NOT_ASKED),
              members=tuple(
                  build(member_class, member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
                        member_epoch=m.member_epoch, client_id=m.client_id, client_host=m.client_host,
                        subscribed_topic_names=m.subscribed_topic_names,
                        subscribed_topic_regex=m.subscribed_topic_regex, assignment=assignment(m.assignment),
                        target_assignment=assignment(m.target_assignment), member_type=m.member_type)
                  for m in g.members))
        for g in groups)
    return build(cls, throttle_time=ZERO_DURATION, groups=described)


async def handle(ctx: ConnectionContext, header: RequestHeader, body: Any) -> Any:
    # KafkaApis: DESCRIBE on each group (the refused ones first); a described group whose members' assignments
    # name a topic the client may not describe is answered TOPIC_AUTHORIZATION_FAILED, without its members
    group_ids = list(body.group_ids)
    refused = [DescribedGroup(g, Errors.GROUP_AUTHORIZATION_FAILED) for g in group_ids
               if not ctx.allows(Operation.DESCRIBE, ResourceType.GROUP, g)]
    allowed = [g for g in group_ids if ctx.allows(Operation.DESCRIBE, ResourceType.GROUP, g)]
    described = await ctx.coordinator.consumer_group_describe(allowed) if allowed else []
    groups = [*refused, *(g if _topics_describable(ctx, g) else DescribedGroup(
        g.group_id, Errors.TOPIC_AUTHORIZATION_FAILED, _TOPICS_REFUSED) for g in described)]
    operations = {g.group_id: ctx.group_operations(g.group_id) for g in groups
                  if g.error == Errors.NONE} if body.include_authorized_operations else None
    return to_response(header.api_version, groups, operations)


def _topics_describable(ctx: ConnectionContext, group: DescribedGroup) -> bool:
    return all(ctx.allows(Operation.DESCRIBE, ResourceType.TOPIC, partitions.topic_name)
               for member in group.members for partitions in (*member.assignment, *member.target_assignment))
