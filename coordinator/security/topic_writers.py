"""A principal other than ours that may write the state or event topic can forge offsets and group membership
(or events): at start, with a secured cluster, the coordinator reads the ACLs that match each topic
(DescribeAcls with pattern type MATCH: literal, prefixed and wildcard bindings alike) and warns about every other
principal allowed to Write (or All). Super users are not listed by any API, and a cluster without an authorizer
(where anyone may write) answers DescribeAcls like one without ACLs: docs/security.md says what to check by hand."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from confluent_kafka import KafkaException

from coordinator.security.clusters import secured

log = logging.getLogger("coordinator.security")


async def warn_about_other_writers(bootstrap: str, our_principal: str | None, topics: Iterable[str],
                                   timeout_s: float = 30.0) -> list[tuple[str, str]]:
    """(topic, principal) pairs allowed to write besides `our_principal` (None: unknown, every principal is
    listed), each logged as a WARNING; never raises (the check is advice, not a condition to start)."""
    from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                       ResourcePatternType, ResourceType)

    admin = AdminClient(secured({"bootstrap.servers": bootstrap, "client.id": "group-coordinator-acl-check"}))
    found: list[tuple[str, str]] = []
    try:
        for topic in topics:
            # None: any principal, any host (the filter's wildcard; the stubs type both as str)
            matching = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.MATCH,
                                        None, None,  # type: ignore[arg-type]
                                        AclOperation.ANY, AclPermissionType.ALLOW)
            try:
                bindings = await asyncio.wait_for(asyncio.wrap_future(
                    admin.describe_acls(matching, request_timeout=timeout_s)), timeout_s + 5)
            except KafkaException as exc:
                log.info("event=topic_acls_unreadable topic=%s error=%s (DescribeAcls needs Describe on the "
                         "cluster)", topic, exc)
                continue
            for binding in bindings:
                if binding.operation not in (AclOperation.WRITE, AclOperation.ALL):
                    continue
                if our_principal is not None and binding.principal == our_principal:
                    continue
                found.append((topic, binding.principal))
                log.warning("event=state_topic_writable_by_another topic=%s principal=%s pattern=%s:%s host=%s "
                            "(it could forge group state or events: only the coordinator's principal should "
                            "write it)", topic, binding.principal, binding.resource_pattern_type.name,
                            binding.name, binding.host)
    except Exception as exc:  # the check must never stop a start
        log.info("event=topic_acls_unreadable error=%r", exc)
    finally:
        del admin  # destroyed here, on the loop's thread
    return found
