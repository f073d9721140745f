"""The group handlers' checks against an Authorizer with ACLs, on a real server over loopback (a PLAINTEXT
listener: every client is User:ANONYMOUS from 127.0.0.1). The comparison with Kafka's own answers is
tests/integration/test_secured_acls.py; these pin the paths it does not take (every Heartbeat version, the hot
path and the general one; authorized operations without an authorizer; a new snapshot applied at once)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from coordinator.security.authorizer import (
    ANONYMOUS, Acl, Acls, Authorizer, Operation, PatternType, Permission, ResourceType,
)
from coordinator.embedded.certificates import make_test_certificates
from coordinator.security.access import access_settings
from coordinator.security.listeners import Listener, server_ssl_context
from protocol.apis import ApiKey
from protocol.errors import ConnectionClosed, RequestTimedOut
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


async def test_a_certificate_no_mapping_rule_applies_to_is_refused_and_a_mapped_one_gets_its_acls(
        tmp_path: Path) -> None:
    certificates = make_test_certificates(tmp_path, clients=("Carol", "dave"))
    server_tls = server_ssl_context(Listener("SSL", "127.0.0.1", 0), {
        "ssl.keystore.location": str(certificates.broker_keystore), "ssl.truststore.location": str(certificates.ca),
        "ssl.client.auth": "required"})
    access = access_settings({"ssl.principal.mapping.rules": "RULE:^CN=(Carol),OU=test,O=coordinator$/$1/L"})
    acls = enforcing(Acl(ResourceType.GROUP, "app-", PatternType.PREFIXED, "User:carol", "*", Operation.READ,
                         Permission.ALLOW))

    def tls_as(name: str) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(certificates.ca))
        keystore = str(certificates.client_keystore(name))
        context.load_cert_chain(keystore, keystore)
        return context

    async with RunningServer(authorizer=acls, ssl_context=server_tls, access=access) as env:
        carol = await env.client(ssl=tls_as("Carol"))
        assert (await carol.request(heartbeat("app-1", 1, "m"))).error_code == 25  # User:carol, past the check
        assert (await carol.request(heartbeat("other", 1, "m"))).error_code == 30
        with pytest.raises((ConnectionClosed, RequestTimedOut, OSError)):  # no rule applies: closed, as Kafka
            dave = await env.client(ssl=tls_as("dave"), timeout_ms=5_000)
            await dave.request(heartbeat("app-1", 1, "m"), timeout_ms=5_000)
