"""A principal other than ours that may write the state or event topic can forge offsets and group membership
(or events): at start the coordinator looks through the cluster's ACLs it has just read (acl_cache.py: literal,
prefixed and wildcard bindings alike) and warns about every other principal allowed to Write (or All) on each
topic, and about a cluster without an authorizer, where anyone may write. Super users are not listed by any API:
docs/security.md says what to check by hand."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from coordinator.security.authorizer import Authorizer, Operation, Permission, ResourceType

log = logging.getLogger("coordinator.security")


def warn_about_other_writers(authorizer: Authorizer, our_principal: str | None,
                             topics: Iterable[str]) -> list[tuple[str, str]]:
    """(topic, principal) pairs allowed to write besides `our_principal` (None: unknown, every principal is
    listed), each logged as a WARNING; ("*", "*") when the cluster has no authorizer."""
    if not authorizer.enforcing:
        log.warning("event=state_topic_writable_by_anyone reason=the cluster has no authorizer (DescribeAcls: "
                    "SECURITY_DISABLED): any client can forge group state or events")
        return [("*", "*")]
    found: list[tuple[str, str]] = []
    for topic in topics:
        for acl in authorizer.acls.on(ResourceType.TOPIC, topic):
            if acl.permission != Permission.ALLOW or acl.operation not in (Operation.WRITE, Operation.ALL):
                continue
            if our_principal is not None and acl.principal == our_principal:
                continue
            found.append((topic, acl.principal))
            log.warning("event=state_topic_writable_by_another topic=%s principal=%s pattern=%s:%s host=%s (it "
                        "could forge group state or events: only the coordinator's principal should write it)",
                        topic, acl.principal, acl.pattern.name, acl.name, acl.host)
    return found
