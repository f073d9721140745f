"""The cluster's ACLs evaluated as Kafka's StandardAuthorizer does (metadata/.../StandardAuthorizerData.java), for
the group APIs this coordinator answers itself.

A principal listed in `super.users` may do everything. Otherwise the ACLs on the resource are those whose pattern
names it: LITERAL with its exact name, LITERAL `*`, or PREFIXED with a prefix of its name. Of those, an ACL applies
when its principal is the client's or `User:*`, its host is `*` or the client's address, and its operation is the
one asked for or ALL; an ALLOW of READ, WRITE, DELETE or ALTER also grants DESCRIBE, and an ALLOW of ALTER_CONFIGS
DESCRIBE_CONFIGS (a DENY implies nothing). Any applying DENY wins; else any applying ALLOW allows; else, only when
the resource has no ACL at all (for anyone), `allow.everyone.if.no.acl.found` decides; otherwise denied.

`Acls` is an immutable snapshot (the cache swaps whole snapshots); `Authorizer` holds the current one with the
listener's settings and memoises decisions per snapshot, so the hot path (a heartbeat) is one dictionary lookup.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

ANONYMOUS = "User:ANONYMOUS"
WILDCARD_PRINCIPAL = "User:*"
WILDCARD = "*"
CLUSTER_NAME = "kafka-cluster"
_MEMO_LIMIT = 100_000  # decisions remembered per snapshot (principals x resources x operations in use)


class Operation(enum.IntEnum):
    """Kafka's AclOperation codes."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class ResourceType(enum.IntEnum):
    """Kafka's ResourceType codes."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


_IMPLIES_DESCRIBE = frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE,
                               Operation.ALTER})
_IMPLIES_DESCRIBE_CONFIGS = frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS})
# AclEntry.supportedOperations(GROUP): what DescribeGroups' authorized operations are computed over
GROUP_OPERATIONS = (Operation.READ, Operation.DESCRIBE, Operation.DELETE, Operation.DESCRIBE_CONFIGS,
                    Operation.ALTER_CONFIGS)


@dataclass(frozen=True, slots=True)
class Acl:
    resource_type: ResourceType
    name: str
    pattern: PatternType  # LITERAL or PREFIXED
    principal: str  # "User:alice", "User:*"
    host: str  # "*" or an address as Java's getHostAddress() writes it
    operation: Operation
    permission: Permission  # ALLOW or DENY

    def __str__(self) -> str:
        return (f"{self.permission.name} {self.principal} {self.operation.name} on {self.resource_type.name}:"
                f"{self.pattern.name}:{self.name} from {self.host}")


def _applies(acl: Acl, principal: str, host: str, operation: Operation) -> bool:
    if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
        return False
    if acl.host != WILDCARD and acl.host != host:
        return False
    if acl.operation == Operation.ALL or acl.operation == operation:
        return True
    if acl.permission != Permission.ALLOW:
        return False
    if operation == Operation.DESCRIBE:
        return acl.operation in _IMPLIES_DESCRIBE
    if operation == Operation.DESCRIBE_CONFIGS:
        return acl.operation in _IMPLIES_DESCRIBE_CONFIGS
    return False


class Acls:
    """One immutable set of ACLs, indexed by resource type: literal names, and prefixes."""

    __slots__ = ("_literal", "_prefixed", "count")

    def __init__(self, acls: Iterable[Acl] = ()) -> None:
        self._literal: dict[tuple[ResourceType, str], list[Acl]] = {}
        self._prefixed: dict[tuple[ResourceType, str], list[Acl]] = {}
        self.count = 0
        for acl in acls:
            if acl.pattern == PatternType.LITERAL:
                self._literal.setdefault((acl.resource_type, acl.name), []).append(acl)
            elif acl.pattern == PatternType.PREFIXED:
                self._prefixed.setdefault((acl.resource_type, acl.name), []).append(acl)
            else:
                continue  # Kafka stores only literal and prefixed bindings
            self.count += 1

    def on(self, resource_type: ResourceType, name: str) -> list[Acl]:
        """Every ACL whose pattern names the resource, whoever it is for."""
        found = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            found.extend(self._literal.get((resource_type, WILDCARD), ()))
        if self._prefixed:
            for end in range(len(name) + 1):
                found.extend(self._prefixed.get((resource_type, name[:end]), ()))
        return found


@dataclass(frozen=True)
class Decision:
    allowed: bool
    rule: str  # "SuperUser", "DefaultAllow", "DefaultDeny", "MatchingAcl(...)", as Kafka's audit log names it


def decide(acls: Acls, principal: str, host: str, operation: Operation, resource_type: ResourceType, name: str,
           super_users: frozenset[str], allow_if_no_acl: bool) -> Decision:
    if principal in super_users:
        return Decision(True, "SuperUser")
    on_resource = acls.on(resource_type, name)
    allow = None
    for acl in on_resource:
        if _applies(acl, principal, host, operation):
            if acl.permission == Permission.DENY:
                return Decision(False, f"MatchingAcl({acl})")
            if acl.permission == Permission.ALLOW:
                allow = acl
    if allow is not None:
        return Decision(True, f"MatchingAcl({allow})")
    if not on_resource:
        return Decision(allow_if_no_acl, "DefaultAllow" if allow_if_no_acl else "DefaultDeny")
    return Decision(False, "DefaultDeny")


class Authorizer:
    """The cluster's ACLs and our listener's authorizer settings. `enforcing` is False while the cluster has no
    authorizer (DescribeAcls answers SECURITY_DISABLED): then everything is allowed, as on such a cluster."""

    def __init__(self, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = False) -> None:
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_everyone_if_no_acl_found
        self.enforcing = False
        self.acls = Acls()
        self.refused = 0  # checks answered "no", for the metrics
        self._memo: dict[tuple[str, str, int, int, str], bool] = {}

    def use(self, acls: Acls | None) -> None:
        """The cluster's current ACLs; None: the cluster has no authorizer."""
        self.enforcing = acls is not None
        self.acls = acls if acls is not None else Acls()
        self._memo = {}

    def allows(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
               name: str, *, audited: bool = True) -> bool:
        """`audited=False`: a filter's check (Kafka's logIfDenied false), not counted as a refusal."""
        if not self.enforcing:
            return True
        key = (principal, host, operation, resource_type, name)
        allowed = self._memo.get(key)
        if allowed is None:
            allowed = decide(self.acls, principal, host, operation, resource_type, name, self.super_users,
                             self.allow_if_no_acl).allowed
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo = {}
            self._memo[key] = allowed
        if not allowed and audited:
            self.refused += 1
        return allowed

    def authorized_operations(self, principal: str, host: str, resource_type: ResourceType, name: str,
                              operations: Iterable[Operation] = GROUP_OPERATIONS) -> int:
        """KIP-430's bit field (1 << operation code) of the operations allowed; every supported one without an
        authorizer (AuthHelper.authorizedOperations)."""
        return sum(1 << op for op in operations if self.allows(principal, host, op, resource_type, name))


def parse_super_users(text: str) -> frozenset[str]:
    """`super.users`: principals separated by `;` (Kafka splits on ';' and trims)."""
    return frozenset(part.strip() for part in text.split(";") if part.strip())
