"""Server-side assignors of the consumer group protocol (KIP-848): pure functions from a group spec (each member's
subscribed topic ids and current target) and the subscribed topics' partition counts to each member's new target.
Kafka 4's `group.consumer.assignors` default is `uniform, range`; the first is the default."""

from typing import Protocol

from coordinator.group.assignor.spec import (Assignment, AssignorError, GroupSpec, MemberSpec, SubscriptionType,
                                             TopicPartitions)
from coordinator.group.assignor.range import RangeAssignor
from coordinator.group.assignor.uniform import UniformAssignor


class Assignor(Protocol):
    """What the target computation asks of an assignor (a protocol, not the two classes: compiled callers would
    refuse any other object, e.g. a test's that counts the runs)."""

    @property
    def name(self) -> str: ...

    def assign(self, spec: GroupSpec) -> dict[str, Assignment]: ...


ASSIGNORS: dict[str, Assignor] = {assignor.name: assignor for assignor in (UniformAssignor(), RangeAssignor())}
DEFAULT_ASSIGNOR = UniformAssignor.name

__all__ = ["ASSIGNORS", "DEFAULT_ASSIGNOR", "Assignment", "Assignor", "AssignorError", "GroupSpec", "MemberSpec",
           "RangeAssignor", "SubscriptionType", "TopicPartitions", "UniformAssignor"]
