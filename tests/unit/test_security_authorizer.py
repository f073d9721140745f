"""StandardAuthorizer's semantics (StandardAuthorizerData.java) on the group and topic resources the group APIs
check: patterns, DENY over ALLOW, principals and hosts, implied operations, super users, the no-ACL default."""

from __future__ import annotations

import pytest

from coordinator.security.authorizer import (
    Acl, Acls, Authorizer, Operation, PatternType, Permission, ResourceType, decide, parse_super_users,
)

GROUP, TOPIC = ResourceType.GROUP, ResourceType.TOPIC
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
READ, DESCRIBE, DELETE = Operation.READ, Operation.DESCRIBE, Operation.DELETE


def acl(name: str, operation: Operation, permission: Permission = ALLOW, pattern: PatternType = LITERAL,
        principal: str = "User:alice", host: str = "*", resource_type: ResourceType = GROUP) -> Acl:
    return Acl(resource_type, name, pattern, principal, host, operation, permission)


def allowed(acls: list[Acl], operation: Operation, name: str = "app", principal: str = "User:alice",
            host: str = "10.0.0.1", resource_type: ResourceType = GROUP, super_users: frozenset[str] = frozenset(),
            allow_if_no_acl: bool = False) -> bool:
    return decide(Acls(acls), principal, host, operation, resource_type, name, super_users, allow_if_no_acl).allowed


def test_literal_prefixed_and_wildcard_patterns_name_the_resource() -> None:
    assert allowed([acl("app", READ)], READ)
    assert not allowed([acl("app", READ)], READ, name="app2")  # a literal name is the whole name
    assert allowed([acl("ap", READ, pattern=PREFIXED)], READ, name="app2")
    assert not allowed([acl("app2", READ, pattern=PREFIXED)], READ, name="app")
    assert allowed([acl("*", READ)], READ, name="anything")
    assert not allowed([acl("*", READ, pattern=PREFIXED)], READ, name="anything")  # '*' is literal in a prefix


def test_any_applying_deny_wins_over_any_allow() -> None:
    assert not allowed([acl("app", READ), acl("a", READ, DENY, PREFIXED)], READ)
    assert not allowed([acl("*", Operation.ALL), acl("app", READ, DENY)], READ)
    assert not allowed([acl("app", READ), acl("app", READ, DENY, principal="User:*")], READ)
    # a DENY for someone else, another host or another operation does not apply
    assert allowed([acl("app", READ), acl("app", READ, DENY, principal="User:bob")], READ)
    assert allowed([acl("app", READ), acl("app", READ, DENY, host="10.0.0.2")], READ)
    assert allowed([acl("app", Operation.ALL), acl("app", DELETE, DENY)], READ)


def test_principal_and_host_must_match_or_be_wildcards() -> None:
    assert allowed([acl("app", READ, principal="User:*")], READ)
    assert not allowed([acl("app", READ, principal="User:bob")], READ)
    assert not allowed([acl("app", READ, principal="Group:*")], READ)  # only User:* is a wildcard principal
    assert allowed([acl("app", READ, host="10.0.0.1")], READ)
    assert not allowed([acl("app", READ, host="10.0.0.2")], READ)


@pytest.mark.parametrize("granted", [READ, Operation.WRITE, DELETE, Operation.ALTER, DESCRIBE])
def test_allow_of_read_write_delete_alter_implies_describe(granted: Operation) -> None:
    assert allowed([acl("app", granted)], DESCRIBE)


def test_implication_is_only_for_allow_and_only_those_operations() -> None:
    assert not allowed([acl("app", Operation.CREATE)], DESCRIBE)
    assert not allowed([acl("app", DESCRIBE)], READ)
    assert allowed([acl("app", Operation.ALTER_CONFIGS)], Operation.DESCRIBE_CONFIGS)
    assert not allowed([acl("app", Operation.DESCRIBE_CONFIGS)], Operation.ALTER_CONFIGS)
    # DENY READ does not deny DESCRIBE; the ALLOW READ implies it
    assert allowed([acl("app", READ), acl("app", READ, DENY)], DESCRIBE)


def test_no_acl_on_the_resource_uses_allow_everyone_if_no_acl_found() -> None:
    assert not allowed([], READ)
    assert allowed([], READ, allow_if_no_acl=True)
    assert allowed([acl("other", READ)], READ, allow_if_no_acl=True)
    # an ACL on the resource for anyone at all turns the default off
    assert not allowed([acl("app", READ, principal="User:bob")], READ, allow_if_no_acl=True)
    assert not allowed([acl("a", DELETE, pattern=PREFIXED)], READ, allow_if_no_acl=True)
    # topics and groups are separate resources
    assert allowed([acl("app", READ, resource_type=TOPIC, principal="User:bob")], READ, allow_if_no_acl=True)


def test_super_users_may_do_everything_even_when_denied() -> None:
    supers = parse_super_users(" User:admin ; User:ops;")
    assert supers == {"User:admin", "User:ops"}
    assert allowed([acl("app", Operation.ALL, DENY, principal="User:*")], DELETE, principal="User:ops",
                   super_users=supers)


def test_authorizer_enforces_only_with_acls_and_forgets_decisions_on_a_new_snapshot() -> None:
    authorizer = Authorizer()
    assert authorizer.allows("User:alice", "10.0.0.1", READ, GROUP, "app")  # no authorizer on the cluster
    assert authorizer.authorized_operations("User:alice", "10.0.0.1", GROUP, "app") == 3400
    authorizer.use(Acls([acl("app", READ)]))
    assert authorizer.allows("User:alice", "10.0.0.1", READ, GROUP, "app")
    assert authorizer.authorized_operations("User:alice", "10.0.0.1", GROUP, "app") == (1 << 3) | (1 << 8)
    authorizer.use(Acls([acl("app", READ, DENY)]))  # revoked
    assert not authorizer.allows("User:alice", "10.0.0.1", READ, GROUP, "app")
    assert authorizer.authorized_operations("User:alice", "10.0.0.1", GROUP, "app") == 0
    authorizer.use(None)
    assert authorizer.allows("User:alice", "10.0.0.1", READ, GROUP, "app")
