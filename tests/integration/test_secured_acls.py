"""The cluster's own ACLs on our group APIs, compared with Kafka's answers: a real 4.1 broker with Kafka's
StandardAuthorizer, the same principals, the same ACLs and the same group requests sent straight to the broker's
own group coordinator and through our listener; every answer must be the same (error codes, per-topic errors,
authorized operations, which groups are listed). Principals from SASL (SCRAM) and from client certificates through
`ssl.principal.mapping.rules`; an ACL removed on the cluster takes effect here within the refresh interval."""

from __future__ import annotations

import asyncio
import datetime
import json
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   NewTopic, ResourcePatternType, ResourceType)

from coordinator.embedded import EmbeddedKafka
from coordinator.embedded.certificates import CertificateSet, make_test_certificates
from coordinator.embedded.secured import SecureListeners
from coordinator.security.client_config import client_security, load_command_config
from coordinator.security.clusters import ClusterSecurity
from coordinator.security.connections import connect
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from tests.support.service import FAST, service, unique
from tests.support.wire import heartbeat, join, nested, request

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
USERS = {"admin": "admin-secret", "coordinator": "coordinator-secret", "alice": "alice-secret",
         "bob": "bob-secret"}
SUPER_USERS = "User:admin;User:ANONYMOUS"  # the test broker's (ANONYMOUS: its own PLAINTEXT listener)
MAPPING_RULES = "RULE:^CN=([^,]*),OU=test,O=coordinator$/$1/L,DEFAULT"
REFRESH_MS = 1_000
TIMEOUT_S = 120


class AclBroker:
    def __init__(self, broker: EmbeddedKafka, certificates: CertificateSet, directory: Path) -> None:
        self.broker, self.certificates, self.directory = broker, certificates, directory
        self.prefix = unique("acl")  # every group and topic of this module

    def sasl(self, user: str) -> ClusterSecurity:
        security = client_security({
            "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": f'{SCRAM} required username="{user}" password="{USERS[user]}";',
            "ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.certificates.ca)})
        return ClusterSecurity(security, security.ssl_context(), security.librdkafka_settings())

    def properties(self, user: str) -> Path:
        path = self.directory / f"{user}.properties"
        path.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.jaas.config={SCRAM} "
                        f"required username=\"{user}\" password=\"{USERS[user]}\";\nssl.truststore.type=PEM\n"
                        f"ssl.truststore.location={self.certificates.ca}\n")
        return path

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.broker.sasl_ssl_bootstrap,
                            **self.sasl("admin").librdkafka})

    def acls(self, *bindings: AclBinding) -> None:
        admin = self.admin()  # kept until the answers are in (a destroyed client fails its futures)
        for future in admin.create_acls(list(bindings)).values():
            future.result(60)

    def remove(self, binding: AclBinding) -> None:
        matching = AclBindingFilter(binding.restype, binding.name, binding.resource_pattern_type, binding.principal,
                                    binding.host, binding.operation, binding.permission_type)
        admin = self.admin()
        for future in admin.delete_acls([matching]).values():
            assert future.result(60), f"no ACL removed for {binding}"


def allow(kind: ResourceType, name: str, principal: str, operation: AclOperation,
          pattern: ResourcePatternType = ResourcePatternType.LITERAL,
          permission: AclPermissionType = AclPermissionType.ALLOW) -> AclBinding:
    return AclBinding(kind, name, pattern, principal, "*", operation, permission)


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclBroker]:
    directory = tmp_path_factory.mktemp("acl-kafka")
    certificates = make_test_certificates(directory / "certificates", clients=("coordinator", "Carol", "dave"))
    broker = EmbeddedKafka(secure=SecureListeners(certificates, users=USERS, authorizer=True), startup_timeout_s=240,
                           extra_properties={"ssl.principal.mapping.rules": MAPPING_RULES})
    broker.start_blocking()
    try:
        setup = AclBroker(broker, certificates, directory)
        prefix = setup.prefix
        topics = [f"{prefix}-t1", f"{prefix}-t2"]
        admin = setup.admin()
        for future in admin.create_topics([NewTopic(t, 2, 1) for t in topics]).values():
            future.result(60)
        coordinator = "User:coordinator"
        group, topic, cluster = ResourceType.GROUP, ResourceType.TOPIC, ResourceType.BROKER
        prefixed, deny = ResourcePatternType.PREFIXED, AclPermissionType.DENY
        setup.acls(
            # the coordinator's own (docs/security.md), DescribeAcls included (Describe on the cluster)
            allow(cluster, "kafka-cluster", coordinator, AclOperation.DESCRIBE),
            allow(topic, f"{prefix}-state", coordinator, AclOperation.ALL, prefixed),
            allow(ResourceType.TRANSACTIONAL_ID, "group-coordinator-", coordinator, AclOperation.ALL, prefixed),
            allow(group, "group-coordinator-loader", coordinator, AclOperation.DESCRIBE),
            # the relay checks that committed partitions exist (Metadata, as the coordinator)
            allow(topic, "*", coordinator, AclOperation.DESCRIBE),
            # alice: READ on her groups by prefix, one of them denied; READ on t1 only
            allow(group, f"{prefix}-app-", "User:alice", AclOperation.READ, prefixed),
            allow(group, f"{prefix}-app-denied", "User:alice", AclOperation.READ, permission=deny),
            allow(topic, f"{prefix}-t1", "User:alice", AclOperation.READ),
            # anyone may delete (and so describe) the -del- groups; bob may describe one consumer group
            allow(group, f"{prefix}-del-", "User:*", AclOperation.DELETE, prefixed),
            allow(group, f"{prefix}-app-cg", "User:bob", AclOperation.DESCRIBE),
            # certificates: carol (CN=Carol, mapped lower case) reads her groups; dave nothing
            allow(group, f"{prefix}-app-", "User:carol", AclOperation.READ, prefixed),
            allow(topic, "*", "User:carol", AclOperation.DESCRIBE),
        )
        yield setup
    finally:
        broker.stop_blocking()
        broker.remove_data()


# ---------------------------------------------------------------------------------------------- the probes


def ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


async def probe(client: KafkaClient, prefix: str) -> dict[str, Any]:
    """The same group requests on one connection; their answers, reduced to what Kafka decides."""
    app, denied, deleted, other = (f"{prefix}-app-1", f"{prefix}-app-denied", f"{prefix}-del-1",
                                   f"{prefix}-other")
    t1, t2, t3 = f"{prefix}-t1", f"{prefix}-t2", f"{prefix}-missing"
    seen: dict[str, Any] = {}

    old = await client.request(request(ApiKey.FIND_COORDINATOR, 3, key=app, key_type=0))
    seen["find_coordinator_v3"] = [(old.error_code, old.error_message if old.error_code else None)
                                   for _ in (0,)]
    new = await client.request(request(ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=(app, denied)))
    seen["find_coordinator_v4"] = [(c.key, c.error_code, c.error_message if c.error_code else None)
                                   for c in new.coordinators]
    seen["join"] = {g: (await join(client, g)).error_code for g in (app, denied, other)}
    sync_body = lambda g: request(ApiKey.SYNC_GROUP, 5, group_id=g, generation_id=1, member_id="m",  # noqa: E731
                                  group_instance_id=None, protocol_type="consumer", protocol_name="range",
                                  assignments=())
    seen["sync"] = {g: (await client.request(sync_body(g))).error_code for g in (app, other)}
    seen["heartbeat"] = {g: (await client.request(heartbeat(g, 1, "m"))).error_code for g in (app, denied, other)}
    member = nested(ApiKey.LEAVE_GROUP, 5, "members")(member_id="m", group_instance_id=None, reason=None)
    leave = await client.request(request(ApiKey.LEAVE_GROUP, 5, group_id=app, members=(member,)))
    seen["leave"] = (leave.error_code, [(m.member_id, m.error_code) for m in leave.members])

    seen["commit"] = {g: await commit(client, g, {t1: (0, 1), t2: (0,), t3: (0,)}) for g in (app, other)}
    seen["fetch_v7"] = await fetch_v7(client, app, {t1: (0, 1), t2: (0,)})
    seen["fetch_v1"] = [await fetch_v7(client, g, {t1: (0,), t2: (0,)}, version=1) for g in (app, other)]
    seen["fetch_v8_all_topics"] = await fetch_v8(client, (app, denied, other))
    seen["describe"] = await describe(client, (app, denied, deleted, other, f"{prefix}-app-cg"))
    listed = await client.request(request(ApiKey.LIST_GROUPS, 4, states_filter=()))
    seen["list"] = sorted(g.group_id for g in listed.groups if g.group_id.startswith(prefix))
    seen["offset_delete"] = await offset_delete(client, deleted, {t1: (0,), t2: (0,)})
    return seen


async def commit(client: KafkaClient, group: str, topics: dict[str, tuple[int, ...]], generation: int = -1,
                 member_id: str = "") -> list[tuple[str, int, int]]:
    entry, partition = nested(ApiKey.OFFSET_COMMIT, 8, "topics"), nested(ApiKey.OFFSET_COMMIT, 8, "topics",
                                                                         "partitions")
    body = request(ApiKey.OFFSET_COMMIT, 8, group_id=group, generation_id_or_member_epoch=generation,
                   member_id=member_id,
                   group_instance_id=None, topics=tuple(entry(name=t, partitions=tuple(
                       partition(partition_index=p, committed_offset=5, committed_leader_epoch=-1,
                                 committed_metadata="") for p in ps)) for t, ps in topics.items()))
    response = await client.request(body)
    return sorted((t.name, p.partition_index, p.error_code) for t in response.topics for p in t.partitions)


async def fetch_v7(client: KafkaClient, group: str, topics: dict[str, tuple[int, ...]], version: int = 7) -> Any:
    entry = nested(ApiKey.OFFSET_FETCH, version, "topics")
    response = await client.request(request(ApiKey.OFFSET_FETCH, version, group_id=group, require_stable=False,
                                            topics=tuple(entry(name=t, partition_indexes=ps)
                                                         for t, ps in topics.items())))
    return getattr(response, "error_code", None), sorted((t.name, p.partition_index, p.committed_offset, p.error_code)
                                       for t in response.topics for p in t.partitions)


async def fetch_v8(client: KafkaClient, groups: tuple[str, ...]) -> Any:
    entry = nested(ApiKey.OFFSET_FETCH, 8, "groups")
    response = await client.request(request(ApiKey.OFFSET_FETCH, 8, require_stable=False, groups=tuple(
        entry(group_id=g, topics=None) for g in groups)))
    return [(g.group_id, g.error_code, sorted((t.name, p.partition_index, p.committed_offset, p.error_code)
                                              for t in g.topics for p in t.partitions)) for g in response.groups]


async def describe(client: KafkaClient, groups: tuple[str, ...]) -> Any:
    response = await client.request(request(ApiKey.DESCRIBE_GROUPS, 5, groups=groups,
                                            include_authorized_operations=True))
    # refused groups first, as Kafka answers; the coordinator's own answers in its order (by partition)
    refused = [(g.group_id, g.error_code, g.group_state, g.authorized_operations) for g in response.groups
               if g.error_code == 30]
    return refused + sorted((g.group_id, g.error_code, g.group_state, g.authorized_operations)
                            for g in response.groups if g.error_code != 30)


async def offset_delete(client: KafkaClient, group: str, topics: dict[str, tuple[int, ...]]) -> Any:
    entry, partition = nested(ApiKey.OFFSET_DELETE, 0, "topics"), nested(ApiKey.OFFSET_DELETE, 0, "topics",
                                                                         "partitions")
    response = await client.request(request(ApiKey.OFFSET_DELETE, 0, group_id=group, topics=tuple(
        entry(name=t, partitions=tuple(partition(partition_index=p) for p in ps)) for t, ps in topics.items())))
    return response.error_code, sorted((t.name, p.partition_index, p.error_code)
                                       for t in response.topics for p in t.partitions)


async def delete_groups(client: KafkaClient, groups: tuple[str, ...]) -> Any:
    response = await client.request(request(ApiKey.DELETE_GROUPS, 2, groups_names=groups))
    return sorted((r.group_id, r.error_code) for r in response.results)


async def consumer_group_heartbeat(client: KafkaClient, group: str, topics: tuple[str, ...],
                                   member_epoch: int = 0, member_id: str = "") -> Any:
    return await client.request(request(
        ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, group_id=group, member_id=member_id, member_epoch=member_epoch,
        instance_id=None, rack_id=None, rebalance_timeout=ms(30_000), subscribed_topic_names=topics,
        server_assignor=None, topic_partitions=() if member_epoch == 0 else None))


async def consumer_group_describe(client: KafkaClient, groups: tuple[str, ...]) -> Any:
    response = await client.request(request(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, group_ids=groups,
                                            include_authorized_operations=True))
    rows = [(g.group_id, g.error_code, g.error_message if g.error_code in (29, 30) else None,
             g.authorized_operations) for g in response.groups]
    return [row for row in rows if row[1] == 30] + sorted(row for row in rows if row[1] != 30)  # as describe()


async def prepare(client: KafkaClient, prefix: str) -> None:
    """As the super user: offsets in the groups the probes look at, so both coordinators hold the same groups."""
    for group in (f"{prefix}-app-1", f"{prefix}-del-1", f"{prefix}-other", f"{prefix}-app-denied"):
        async def committed() -> bool:  # Kafka's coordinator makes __consumer_offsets on the first FindCoordinator
            await client.request(request(ApiKey.FIND_COORDINATOR, 3, key=group, key_type=0))  # noqa: B023
            codes = {code for *_rest, code in await commit(client, group, {  # noqa: B023
                f"{prefix}-t1": (0, 1), f"{prefix}-t2": (0,)})}
            assert codes <= {0, 14, 15, 16}, codes  # loading or moving: retried
            return codes == {0}

        await until(committed, TIMEOUT_S, f"offsets committed in {group}")


async def until(condition: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.1)


# ---------------------------------------------------------------------------------------------- the tests


async def test_group_apis_answer_as_kafka_does_under_the_same_acls_and_principals(acl_broker: AclBroker) -> None:
    broker, prefix = acl_broker.broker, acl_broker.prefix
    kafka_host, kafka_port = broker.sasl_ssl_bootstrap.rsplit(":", 1)
    settings = ("ssl.keystore.type=PEM", f"ssl.keystore.location={acl_broker.certificates.broker_keystore}",
                f"super.users={SUPER_USERS}", f"acl.refresh.interval.ms={REFRESH_MS}")
    async with service(broker.sasl_ssl_bootstrap, f"{prefix}-state", *FAST, *settings, relay=True,
                       listen="SASL_SSL://127.0.0.1:0",
                       args=("--command-config", str(acl_broker.properties("coordinator")))) as running:
        async def as_user(user: str, ours: bool) -> KafkaClient:
            host, port = ("127.0.0.1", running.port) if ours else (kafka_host, int(kafka_port))
            return await connect(host, port, acl_broker.sasl(user), client_id=f"acl-{user}", timeout_ms=30_000)

        clients = {(user, ours): await as_user(user, ours) for user in ("admin", "alice", "bob")
                   for ours in (False, True)}
        try:
            await until(lambda: loaded(clients["admin", True], prefix), TIMEOUT_S, "our state loaded")
            for ours in (False, True):
                await prepare(clients["admin", ours], prefix)
            answers: dict[tuple[str, bool], dict[str, Any]] = {}
            for user in ("alice", "bob"):
                for ours in (False, True):
                    answers[user, ours] = await probe(clients[user, ours], prefix)
            for user in ("alice", "bob"):
                for api_name, kafka_answer in answers[user, False].items():
                    assert answers[user, True][api_name] == kafka_answer, (user, api_name, answers[user, True])
            # the ACLs made a difference (the comparison is not of two all-allowing coordinators)
            assert answers["bob", True]["heartbeat"] == {g: 30 for g in answers["bob", True]["heartbeat"]}
            assert answers["alice", True]["describe"][1][3] == (1 << 3) | (1 << 8)  # READ, DESCRIBE

            cg = f"{prefix}-app-cg"
            kip848: dict[bool, list[Any]] = {}
            for ours in (False, True):
                alice, bob = clients["alice", ours], clients["bob", ours]
                refused = await consumer_group_heartbeat(alice, cg, (f"{prefix}-t2",))
                joined = await consumer_group_heartbeat(alice, cg, (f"{prefix}-t1",))
                bobs = await consumer_group_heartbeat(bob, cg, (f"{prefix}-t1",))
                seen = [refused.error_code, joined.error_code, bobs.error_code,
                        (refused.error_message, bobs.error_message)]
                await until(lambda: assigned(alice, cg), 30, "alice's target assignment")
                seen.append(await consumer_group_describe(alice, (cg, f"{prefix}-app-denied")))
                seen.append(await consumer_group_describe(bob, (cg,)))  # may describe the group, not topic t1
                await consumer_group_heartbeat(alice, cg, (f"{prefix}-t1",), member_epoch=-1,
                                               member_id=joined.member_id)
                seen.append(await delete_groups(alice, (f"{prefix}-app-1", f"{prefix}-del-1")))
                kip848[ours] = seen
            assert kip848[True] == kip848[False], kip848
            assert kip848[True][0] == 29 and kip848[True][5][0][1] == 29

            # a revoked ACL: Kafka at once, ours within the refresh interval
            binding = allow(ResourceType.GROUP, f"{prefix}-app-", "User:alice", AclOperation.READ,
                            ResourcePatternType.PREFIXED)
            await asyncio.to_thread(acl_broker.remove, binding)
            revoked = time.monotonic()
            group = f"{prefix}-app-2"

            async def refused_to_alice(ours: bool) -> bool:
                return (await join(clients["alice", ours], group)).error_code == 30

            await until(lambda: refused_to_alice(False), 10, "Kafka applying the revocation")
            await until(lambda: refused_to_alice(True), 10, "our coordinator applying the revocation")
            took_s = time.monotonic() - revoked
            assert took_s <= REFRESH_MS / 1000 + 3, f"revocation applied after {took_s:.1f} s"
            await asyncio.to_thread(acl_broker.acls, binding)  # back, for the module's other tests
        finally:
            for client in clients.values():
                await client.close()
        assert "event=acls_loaded" in running.log_text() and "alice-secret" not in running.log_text()


async def loaded(client: KafkaClient, prefix: str) -> bool:
    response = await client.request(request(ApiKey.DESCRIBE_GROUPS, 5, groups=(f"{prefix}-x",),
                                            include_authorized_operations=False))
    return response.groups[0].error_code != 14


async def assigned(client: KafkaClient, group: str) -> bool:
    response = await client.request(request(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, group_ids=(group,),
                                            include_authorized_operations=False))
    return any(m.target_assignment.topic_partitions for g in response.groups for m in g.members)


async def test_an_oauthbearer_principal_is_the_tokens_sub_claim_as_on_the_broker(acl_broker: AclBroker) -> None:
    """An unsecured OAUTHBEARER token (the test broker's validator) naming alice: her ACLs apply through our SASL
    listener as on the broker."""
    broker, certificates, prefix = acl_broker.broker, acl_broker.certificates, acl_broker.prefix
    kafka_host, kafka_port = broker.sasl_ssl_bootstrap.rsplit(":", 1)
    token = client_security({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
        "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                            'unsecuredLoginStringClaim_sub="alice";',
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(certificates.ca)})
    alice = ClusterSecurity(token, token.ssl_context(), token.librdkafka_settings())
    settings = ("ssl.keystore.type=PEM", f"ssl.keystore.location={certificates.broker_keystore}",
                f"super.users={SUPER_USERS}")
    async with service(broker.sasl_ssl_bootstrap, f"{prefix}-state", *FAST, *settings, relay=True,
                       listen="SASL_SSL://127.0.0.1:0",
                       args=("--command-config", str(acl_broker.properties("coordinator")))) as running:
        answers = {}
        for ours in (False, True):
            host, port = ("127.0.0.1", running.port) if ours else (kafka_host, int(kafka_port))
            client = await connect(host, port, alice, client_id="acl-oauth", timeout_ms=30_000)
            try:
                groups = (f"{prefix}-app-oauth", f"{prefix}-other")
                seen: list[Any] = []

                async def settled() -> bool:  # loading, or Kafka making __consumer_offsets: retried
                    await client.request(request(ApiKey.FIND_COORDINATOR, 3, key=groups[0], key_type=0))  # noqa: B023
                    seen[:] = await describe(client, groups)  # noqa: B023
                    return not {code for _group, code, *_rest in seen} & {14, 15, 16}  # noqa: B023

                await until(settled, TIMEOUT_S, "a settled DescribeGroups answer")
                answers[ours] = (list(seen), [(await client.request(heartbeat(g, 1, "m"))).error_code
                                              for g in groups])
            finally:
                await client.close()
        assert answers[True] == answers[False], answers
        assert answers[True][1] == [25, 30]  # alice's group past the check, the other refused
        assert "principal=User:alice" in running.log_text()


def tls_to(certificates: CertificateSet, name: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certificates.ca))
    keystore = str(certificates.client_keystore(name))
    context.load_cert_chain(keystore, keystore)
    return context


async def test_certificate_principals_follow_the_mapping_rules_as_on_the_broker(acl_broker: AclBroker) -> None:
    """SSL listeners requiring a certificate, ours and the broker's, with the same `ssl.principal.mapping.rules`:
    CN=Carol maps to User:carol (lower-cased by /L) and gets her ACLs; CN=dave to User:dave, who has none."""
    broker, certificates, prefix = acl_broker.broker, acl_broker.certificates, acl_broker.prefix
    kafka_host, kafka_port = broker.ssl_bootstrap.rsplit(":", 1)
    settings = ("ssl.keystore.type=PEM", f"ssl.keystore.location={certificates.broker_keystore}",
                f"ssl.truststore.location={certificates.ca}", "ssl.client.auth=required",
                f"ssl.principal.mapping.rules={MAPPING_RULES}", f"super.users={SUPER_USERS}")
    async with service(broker.sasl_ssl_bootstrap, f"{prefix}-state", *FAST, *settings, relay=True,
                       listen="SSL://127.0.0.1:0",
                       args=("--command-config", str(acl_broker.properties("coordinator")))) as running:
        answers: dict[tuple[str, bool], Any] = {}
        for name in ("Carol", "dave"):
            for ours in (False, True):
                host, port = ("127.0.0.1", running.port) if ours else (kafka_host, int(kafka_port))
                client = await KafkaClient.connect(host, port, client_id="acl-tls", timeout_ms=30_000,
                                                   ssl=tls_to(certificates, name))
                try:
                    group = f"{prefix}-app-tls"
                    described: list[Any] = []

                    async def settled() -> bool:  # loading, or Kafka making __consumer_offsets: retried
                        await client.request(request(ApiKey.FIND_COORDINATOR, 3, key=group,  # noqa: B023
                                                     key_type=0))
                        described[:] = await describe(client, (group, f"{prefix}-other"))  # noqa: B023
                        return not {code for _group, code, *_rest in described} & {14, 15, 16}

                    await until(settled, TIMEOUT_S, "a settled DescribeGroups answer")
                    joined = [(await join(client, group)).error_code]
                    answers[name, ours] = (joined[-1], described,
                                           await commit(client, group, {f"{prefix}-t1": (0,)}))
                finally:
                    await client.close()
        assert answers["Carol", True] == answers["Carol", False], answers
        assert answers["dave", True] == answers["dave", False], answers
        assert answers["Carol", True][0] == 79 and answers["dave", True][0] == 30  # MEMBER_ID_REQUIRED: allowed


async def test_a_coordinator_that_may_not_read_the_acls_says_so_and_exits(acl_broker: AclBroker,
                                                                          tmp_path: Path) -> None:
    """bob has no DESCRIBE on the cluster: DescribeAcls is refused, and the start fails naming the right."""
    import os
    import sys

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "coordinator.cli", "serve", "--listen", "127.0.0.1:0", "--no-relay",
        "--bootstrap-server", acl_broker.broker.sasl_ssl_bootstrap, "--command-config",
        str(acl_broker.properties("bob")), "--state-topic", unique("bob-state"),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _out, err = await asyncio.wait_for(process.communicate(), 90)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    said = [line for line in err.decode(errors="replace").splitlines() if line.startswith("coordinator serve:")]
    assert process.returncode == 1 and len(said) == 1, err.decode(errors="replace")[-3000:]
    assert "DESCRIBE on the cluster" in said[0], err.decode(errors="replace")[-5000:]



async def regex_assignment(client: KafkaClient, group: str, regex: str) -> list[str]:
    """A consumer-protocol member subscribing with `regex` (v1, its own member id), heartbeating as a client does
    until it holds an assignment; the topics of it, by name, as ConsumerGroupDescribe names them."""
    member_id, epoch = str(uuid.uuid4()), 0
    body = lambda: request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, group_id=group, member_id=member_id,  # noqa: E731
                           member_epoch=epoch, instance_id=None, rack_id=None, rebalance_timeout=ms(30_000),
                           subscribed_topic_names=None, subscribed_topic_regex=regex if epoch == 0 else None,
                           server_assignor=None, topic_partitions=() if epoch == 0 else None)

    async def holds_partitions() -> bool:
        nonlocal epoch
        answer = await client.request(body())
        assert answer.error_code in (0, 14, 15, 16), (answer.error_code, answer.error_message)  # loading: again
        if answer.error_code in (15, 16):  # rediscover, as a client does (on Kafka this creates __consumer_offsets)
            await client.request(request(ApiKey.FIND_COORDINATOR, 4, key_type=0, coordinator_keys=(group,)))
        epoch = int(answer.member_epoch) if answer.error_code == 0 else epoch
        return answer.error_code == 0 and answer.assignment is not None and bool(answer.assignment.topic_partitions)

    await until(holds_partitions, 60, f"an assignment in {group}")
    described = await client.request(request(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, group_ids=(group,),
                                             include_authorized_operations=False))
    [described_group] = described.groups  # a topic the member may not describe: 29 (as Kafka answers it)
    assert described_group.error_code == 0, (group, described_group.error_code, described_group.error_message)
    [member] = described_group.members
    await client.request(request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, group_id=group, member_id=member_id,
                                 member_epoch=-1, instance_id=None, rack_id=None, rebalance_timeout=ms(30_000),
                                 subscribed_topic_names=None, subscribed_topic_regex=None, server_assignor=None,
                                 topic_partitions=None))
    return sorted(t.topic_name for t in member.assignment.topic_partitions)


async def test_a_regex_subscription_gets_the_topics_its_principal_may_describe_as_on_the_broker(
        acl_broker: AclBroker) -> None:
    """The same regular expression from two principals with different topic rights: each group's assignment
    holds only the topics its member may DESCRIBE, the same on Kafka's coordinator and on ours."""
    broker, prefix = acl_broker.broker, acl_broker.prefix
    kafka_host, kafka_port = broker.sasl_ssl_bootstrap.rsplit(":", 1)
    visible, hidden = f"{prefix}-rx-visible", f"{prefix}-rx-hidden"
    admin = acl_broker.admin()
    for future in admin.create_topics([NewTopic(t, 2, 1) for t in (visible, hidden)]).values():
        future.result(60)
    group, topic, prefixed = ResourceType.GROUP, ResourceType.TOPIC, ResourcePatternType.PREFIXED
    await asyncio.to_thread(
        acl_broker.acls,
        allow(topic, visible, "User:alice", AclOperation.DESCRIBE),  # alice: one of the two (her groups: app-)
        allow(group, f"{prefix}-rx-", "User:bob", AclOperation.READ, prefixed),  # bob: both topics
        allow(topic, f"{prefix}-rx-", "User:bob", AclOperation.DESCRIBE, prefixed))
    settings = ("ssl.keystore.type=PEM", f"ssl.keystore.location={acl_broker.certificates.broker_keystore}",
                f"super.users={SUPER_USERS}", f"acl.refresh.interval.ms={REFRESH_MS}")
    regex = f"{prefix}-rx-.*"
    async with service(broker.sasl_ssl_bootstrap, f"{prefix}-state", *FAST, *settings, relay=True,
                       listen="SASL_SSL://127.0.0.1:0",
                       args=("--command-config", str(acl_broker.properties("coordinator")))) as running:
        assignments: dict[bool, dict[str, list[str]]] = {}
        for ours in (False, True):
            host, port = ("127.0.0.1", running.port) if ours else (kafka_host, int(kafka_port))
            seen = assignments.setdefault(ours, {})
            for user, member_group in (("alice", f"{prefix}-app-rx-{int(ours)}"),
                                       ("bob", f"{prefix}-rx-{int(ours)}")):
                client = await connect(host, port, acl_broker.sasl(user), client_id=f"rx-{user}", timeout_ms=30_000)
                try:
                    await until(lambda: loaded(client, prefix), TIMEOUT_S, "state loaded")  # noqa: B023
                    seen[user] = await regex_assignment(client, member_group, regex)
                finally:
                    await client.close()
    assert assignments[True] == assignments[False], assignments
    assert assignments[True] == {"alice": [visible], "bob": sorted([hidden, visible])}


async def test_the_principal_is_on_request_spans_member_spans_and_member_events(acl_broker: AclBroker) -> None:
    """Over our SASL_SSL listener: alice's JoinGroup, SyncGroup and OffsetCommit, and her consumer-protocol member
    of another group. Her principal and the listener's security protocol are on the OffsetCommit span, on her
    JoinGroup/SyncGroup wait spans and her reconcile span, on both rebalances' "member joined" events, and in the
    member_joined event on the event topic."""
    from confluent_kafka import Consumer

    from tests.support.otlp_receiver import OtlpReceiver
    from tests.support.wire import sync

    broker, prefix = acl_broker.broker, acl_broker.prefix
    receiver = OtlpReceiver().start()
    group, topic = f"{prefix}-app-traced", f"{prefix}-t1"
    event_topic = f"{prefix}-state-events"  # within the coordinator's prefixed ACL (the fixture's)
    settings = ("ssl.keystore.type=PEM", f"ssl.keystore.location={acl_broker.certificates.broker_keystore}",
                f"super.users={SUPER_USERS}")
    expected = {"coordinator.client.principal": "User:alice", "coordinator.client.security_protocol": "SASL_SSL"}
    try:
        async with service(broker.sasl_ssl_bootstrap, f"{prefix}-state", *FAST, *settings, relay=True,
                           listen="SASL_SSL://127.0.0.1:0", event_topic=event_topic,
                           args=("--command-config", str(acl_broker.properties("coordinator"))),
                           extra_env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                                      "OTEL_BSP_SCHEDULE_DELAY": "200"}) as running:
            alice = await connect("127.0.0.1", running.port, acl_broker.sasl("alice"), client_id="traced-alice",
                                  timeout_ms=30_000)
            try:
                answers: list[Any] = []

                async def member_id_given() -> bool:  # the group's partition loading: asked again
                    answers[:] = [await join(alice, group, topics=(topic,))]
                    return answers[0].error_code != 14

                await until(member_id_given, TIMEOUT_S, "the group's partition loaded")
                joined = await join(alice, group, answers[0].member_id, topics=(topic,))
                assert joined.error_code == 0, joined
                synced = await sync(alice, group, joined.generation_id, joined.member_id,
                                    {joined.member_id: b""})
                assert synced.error_code == 0, synced
                committed = await commit(alice, group, {topic: (0,)}, joined.generation_id, joined.member_id)
                assert committed == [(topic, 0, 0)], committed
                # a consumer-protocol member of another group, until it holds its assignment
                consumer_member = await consumer_group_heartbeat(alice, f"{group}-cg", (topic,))
                assert consumer_member.error_code == 0, consumer_member
                epoch = int(consumer_member.member_epoch)

                def holds(answer: Any) -> bool:  # an assignment is sent when it changes, else null
                    return answer.assignment is not None and bool(answer.assignment.topic_partitions)

                held = holds(consumer_member)

                async def reconciled() -> bool:
                    nonlocal epoch, held
                    answer = await consumer_group_heartbeat(alice, f"{group}-cg", (topic,), epoch,
                                                            consumer_member.member_id)
                    assert answer.error_code == 0, answer
                    epoch, held = int(answer.member_epoch), held or holds(answer)
                    return held

                await until(reconciled, 60, "the consumer-protocol member's assignment")
            finally:
                await alice.close()

            def traced(spans: list[Any]) -> bool:
                names = {s.name for s in spans}
                return ("OffsetCommit" in names and any(n.startswith("SyncGroup wait") for n in names)
                        and f"reconcile {consumer_member.member_id}" in names)

            spans = await asyncio.to_thread(receiver.wait_for, traced, 60)
        [offset_commit] = [s for s in spans if s.name == "OffsetCommit"]
        assert offset_commit.attributes.items() >= expected.items(), offset_commit.attributes
        waits = [s for s in spans if s.name.startswith(("JoinGroup wait", "SyncGroup wait", "reconcile"))]
        assert len(waits) == 3 and all(s.attributes.items() >= expected.items() for s in waits), waits
        joined_events = [attributes for s in spans for name, _, attributes in s.events if name == "member joined"]
        assert len(joined_events) == 2 and all(e.items() >= expected.items() for e in joined_events), joined_events
    finally:
        receiver.stop()

    consumer = Consumer({"bootstrap.servers": broker.sasl_ssl_bootstrap, **acl_broker.sasl("admin").librdkafka,
                         "group.id": unique("traced-reader"), "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([event_topic])
        member_joined: dict[str, Any] | None = None
        deadline = time.monotonic() + 60
        while member_joined is None:
            assert time.monotonic() < deadline, "no member_joined event for the group on the event topic"
            message = await asyncio.to_thread(consumer.poll, 1.0)
            if message is None or message.error():
                continue
            event = json.loads(message.value())
            if event["type"] == "member_joined" and event["group_id"] == group:
                member_joined = event
        assert (member_joined["principal"], member_joined["security_protocol"]) == ("User:alice", "SASL_SSL")
    finally:
        consumer.close()
