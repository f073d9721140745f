"""ConsumerGroupDescribe (69): groups of the KIP-848 protocol with their epochs, members and assignments. v1 adds
each member's type (KIP-1099). Authorized operations are not computed here: INT32_MIN (not asked for) is sent."""

from __future__ import annotations

from typing import Any

from coordinator.group.modern.service import DescribedGroup, DescribedPartitions
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY = ApiKey.CONSUMER_GROUP_DESCRIBE
VERSIONS = (0, 1)
_NOT_ASKED = -2_147_483_648


def to_response(version: int, groups: list[DescribedGroup]) -> Any:
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
              assignor_name=g.assignor_name, authorized_operations=_NOT_ASKED,
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
    groups = await ctx.coordinator.consumer_group_describe(list(body.group_ids))
    return to_response(header.api_version, groups)
