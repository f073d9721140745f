"""`coordinator demo --secure`: the demo's cluster and service secured end to end.

The embedded broker gets its SASL_SSL listener (SCRAM users, the test CA of secured.py) and Kafka's
StandardAuthorizer with no ACL meaning no access. The coordinator reaches it as `admin` (a super user, as the
state topic's only writer should be) over SASL_SSL, and listens with SASL_SSL itself: each client's exchange is
passed through to the broker, which decides. The demo's consumers are `alice`, allowed by ACLs made here only
what a consumer application needs: its groups, its topic, reading the coordinator's event topic.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from coordinator.embedded.secured import SUPER_USERS, SecureListeners, secure_listeners_in, write_client_properties

if TYPE_CHECKING:
    from coordinator.app import ServiceOptions
    from coordinator.embedded.broker import EmbeddedKafka
    from coordinator.security.clusters import ClusterSecurity

COORDINATOR_USER = "admin"
CLIENT_USER = "alice"


@dataclass(frozen=True)
class ClientGrants:
    """What the demo's client user may do: READ on the groups under `group_prefix`, everything on `topic`
    (it creates it, produces and consumes), READ on the coordinator's `event_topic` (the simulation's watcher)."""

    group_prefix: str
    topic: str
    event_topic: str | None


@dataclass(frozen=True)
class SecuredDemoCluster:
    broker: EmbeddedKafka
    secure: SecureListeners
    coordinator_properties: Path  # `coordinator serve --command-config`: admin, SCRAM-SHA-512
    client_properties: Path  # the demo's consumers' (and yours): alice, SCRAM-SHA-512, Java's names
    client_user: str = CLIENT_USER

    @property
    def bootstrap(self) -> str:
        return self.broker.sasl_ssl_bootstrap

    def client_security(self) -> ClusterSecurity:
        """The demo's clients' TLS and SASL (alice), to the coordinator and to the cluster alike."""
        from coordinator.security.client_config import load_command_config
        from coordinator.security.clusters import ClusterSecurity

        return ClusterSecurity.of(load_command_config(self.client_properties))

    def service_options(self, options: ServiceOptions) -> ServiceOptions:
        """`options` with this cluster as the coordinator's, reached as admin, and the coordinator's listener
        (its host and port kept) SASL_SSL with the broker's certificate, passing SASL through to the broker,
        with the broker's super users and no-ACL rule."""
        from coordinator.security.access import AccessSettings
        from coordinator.security.authorizer import parse_super_users
        from coordinator.security.client_config import load_command_config
        from coordinator.security.listeners import Listener, server_ssl_context

        if options.relay is None:
            raise ValueError("--secure needs the relay (SASL on our listener is passed through to the cluster by "
                             "it): drop --no-relay")
        server = options.server
        tls = server_ssl_context(Listener("SASL_SSL", server.listen_host, server.listen_port),
                                 {"ssl.keystore.type": "PEM",
                                  "ssl.keystore.location": str(self.secure.certificates.broker_keystore)})
        access = dataclasses.replace(server.access or AccessSettings(), super_users=parse_super_users(SUPER_USERS),
                                     allow_everyone_if_no_acl_found=False)
        return dataclasses.replace(
            options, bootstrap=self.bootstrap, kafka_data_dir=None,
            client_security=load_command_config(self.coordinator_properties),
            server=dataclasses.replace(server, ssl_context=tls, sasl_passthrough=True, access=access),
            relay=dataclasses.replace(options.relay, sasl_passthrough=True))


@contextlib.asynccontextmanager
async def secured_demo_cluster(data_dir: Path, grants: ClientGrants) -> AsyncIterator[SecuredDemoCluster]:
    """The secured broker running on `data_dir` (kept: certificates, users and ACLs stay for the next run), the
    client user's ACLs made; stopped on exit."""
    import asyncio

    from coordinator.embedded.broker import EmbeddedKafka

    secure = dataclasses.replace(secure_listeners_in(data_dir), authorizer=True)
    broker = EmbeddedKafka(str(data_dir), secure=secure)
    await broker.start()
    try:
        files = write_client_properties(secure, user=COORDINATOR_USER)
        client_files = write_client_properties(secure, user=CLIENT_USER)
        cluster = SecuredDemoCluster(broker, secure, files["SASL_SSL"], client_files["SASL_SSL"])
        await asyncio.to_thread(grant, cluster, grants)
        yield cluster
    finally:
        await broker.stop()


def grant(cluster: SecuredDemoCluster, grants: ClientGrants, timeout_s: float = 60) -> None:
    """The client user's ACLs, made as admin (making one that exists is no change)."""
    from confluent_kafka.admin import (
        AclBinding, AclOperation, AclPermissionType, AdminClient, ResourcePatternType, ResourceType,
    )

    from coordinator.security.client_config import load_command_config

    principal = f"User:{CLIENT_USER}"

    def allow(kind: ResourceType, name: str, pattern: ResourcePatternType, operation: AclOperation) -> AclBinding:
        return AclBinding(kind, name, pattern, principal, "*", operation, AclPermissionType.ALLOW)

    bindings = [allow(ResourceType.GROUP, grants.group_prefix, ResourcePatternType.PREFIXED, AclOperation.READ),
                allow(ResourceType.TOPIC, grants.topic, ResourcePatternType.LITERAL, AclOperation.ALL)]
    if grants.event_topic:
        bindings.append(allow(ResourceType.TOPIC, grants.event_topic, ResourcePatternType.LITERAL, AclOperation.READ))
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 3,
                         **load_command_config(cluster.coordinator_properties).librdkafka_settings()})
    for future in admin.create_acls(bindings, request_timeout=timeout_s).values():
        future.result(timeout_s)
