"""The group handlers' checks against an Authorizer with ACLs, on a real server over loopback (a PLAINTEXT
listener: every client is User:ANONYMOUS from 127.0.0.1). The comparison with Kafka's own answers is
tests/integration/test_secured_acls.py; these pin the paths it does not take (every Heartbeat version, the hot
path and the general one; authorized operations without an authorizer; a new snapshot applied at once)."""

from __future__ import annotations

import pytest

from coordinator.security.authorizer import (
    ANONYMOUS, Acl, Acls, Authorizer, Operation, PatternType, Permission, ResourceType,
)
from protocol.apis import ApiKey
from tests.support.server import RunningServer
from tests.support.wire import heartbeat, join, request

ALL_GROUP_OPERATIONS = (1 << 3) | (1 << 8) | (1 << 6) | (1 << 10) | (1 << 11)


def allow(name: str, operation: Operation, resource_type: ResourceType = ResourceType.GROUP,
          pattern: PatternType = PatternType.PREFIXED, host: str = "*") -> Acl:
    return Acl(resource_type, name, pattern, ANONYMOUS, host, operation, Permission.ALLOW)


def enforcing(*acls: Acl) -> Authorizer:
    authorizer = Authorizer()
    authorizer.use(Acls(acls))
    return authorizer


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
async def test_heartbeat_needs_read_on_the_group_at_every_version(version: int) -> None:
    async with RunningServer(authorizer=enforcing(allow("app-", Operation.READ))) as env:
        client = await env.client()
        denied = await client.request(heartbeat("other", 1, "m", version=version))
        allowed = await client.request(heartbeat("app-1", 1, "m", version=version))
        assert denied.error_code == 30 and allowed.error_code == 25  # UNKNOWN_MEMBER_ID: past the check


async def test_host_of_the_acl_must_be_the_clients_address() -> None:
    acls = (allow("app-", Operation.READ, host="10.9.9.9"), allow("own-", Operation.READ, host="127.0.0.1"))
    async with RunningServer(authorizer=enforcing(*acls)) as env:
        client = await env.client()
        assert (await join(client, "app-1")).error_code == 30
        assert (await join(client, "own-1")).error_code == 79  # MEMBER_ID_REQUIRED: allowed


async def test_list_groups_is_filtered_unless_the_client_may_describe_the_cluster() -> None:
    authorizer = Authorizer()  # not enforcing yet: both groups are made
    async with RunningServer(authorizer=authorizer) as env:
        client = await env.client()
        for group in ("app-1", "hidden"):
            assert (await join(client, group)).error_code == 79  # MEMBER_ID_REQUIRED leaves the group here
        authorizer.use(Acls([allow("app-", Operation.READ)]))
        listed = await client.request(request(ApiKey.LIST_GROUPS, 4, states_filter=()))
        assert {g.group_id for g in listed.groups} == {"app-1"}
        authorizer.use(Acls([allow("app-", Operation.READ), allow("kafka-cluster", Operation.DESCRIBE,
                                                                   ResourceType.CLUSTER, PatternType.LITERAL)]))
        listed = await client.request(request(ApiKey.LIST_GROUPS, 4, states_filter=()))
        assert {g.group_id for g in listed.groups} == {"app-1", "hidden"}


async def test_describe_groups_authorized_operations_without_and_with_an_authorizer() -> None:
    async with RunningServer() as env:  # no authorizer: every operation a group supports, as Kafka answers
        client = await env.client()
        described = await client.request(request(ApiKey.DESCRIBE_GROUPS, 5, groups=("g",),
                                                 include_authorized_operations=True))
        assert described.groups[0].authorized_operations == ALL_GROUP_OPERATIONS
        not_asked = await client.request(request(ApiKey.DESCRIBE_GROUPS, 5, groups=("g",),
                                                 include_authorized_operations=False))
        assert not_asked.groups[0].authorized_operations == -2147483648
    async with RunningServer(authorizer=enforcing(allow("g", Operation.DELETE))) as env:
        client = await env.client()
        described = await client.request(request(ApiKey.DESCRIBE_GROUPS, 5, groups=("g", "x"),
                                                 include_authorized_operations=True))
        by_group = {g.group_id: (g.error_code, g.authorized_operations) for g in described.groups}
        assert by_group == {"x": (30, -2147483648), "g": (0, (1 << 6) | (1 << 8))}  # DELETE implies DESCRIBE


async def test_a_revocation_applies_to_the_next_request() -> None:
    authorizer = enforcing(allow("app-", Operation.READ))
    async with RunningServer(authorizer=authorizer) as env:
        client = await env.client()
        assert (await client.request(heartbeat("app-1", 1, "m"))).error_code == 25
        authorizer.use(Acls([]))
        assert (await client.request(heartbeat("app-1", 1, "m"))).error_code == 30
