"""Who else may write the state and event topics, from the cluster's ACLs as read: every other principal with an
applying ALLOW of Write or All (literal, prefixed, '*'), and anyone at all on a cluster without an authorizer."""

from __future__ import annotations

from coordinator.security.authorizer import Acl, Acls, Authorizer, Operation, PatternType, Permission, ResourceType
from coordinator.security.topic_writers import warn_about_other_writers


def topic_acl(name: str, principal: str, operation: Operation, pattern: PatternType = PatternType.LITERAL,
              permission: Permission = Permission.ALLOW) -> Acl:
    return Acl(ResourceType.TOPIC, name, pattern, principal, "*", operation, permission)


def test_other_writers_by_every_pattern_and_not_ourselves_nor_readers() -> None:
    authorizer = Authorizer()
    authorizer.use(Acls([
        topic_acl("__state", "User:coordinator", Operation.WRITE),
        topic_acl("__st", "User:*", Operation.WRITE, PatternType.PREFIXED),
        topic_acl("*", "User:ops", Operation.ALL),
        topic_acl("__state", "User:reader", Operation.READ),
        topic_acl("__state", "User:denied", Operation.WRITE, permission=Permission.DENY),
        topic_acl("__events", "User:analytics", Operation.WRITE),
    ]))
    found = warn_about_other_writers(authorizer, "User:coordinator", ["__state"])
    assert sorted(found) == [("__state", "User:*"), ("__state", "User:ops")]


def test_a_cluster_without_an_authorizer_lets_anyone_write() -> None:
    assert warn_about_other_writers(Authorizer(), "User:coordinator", ["__state"]) == [("*", "*")]
