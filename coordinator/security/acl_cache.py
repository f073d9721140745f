"""The cluster's ACLs, read with DescribeAcls (every binding: any resource, any pattern, any principal) through an
admin client with the coordinator's own credentials, and read again every `acl.refresh.interval.ms`.

A cluster without an authorizer answers SECURITY_DISABLED: then nothing is enforced here either, as on that
cluster. Kafka 4.1 answers a principal without DESCRIBE on the cluster with no ACLs rather than an error, so
every read also asks DescribeCluster for our authorized operations: without DESCRIBE the start stops with one line
saying so (and a refresh is refused, keeping the ACLs last read). Kafka applies an ACL change at once; here it applies at the
next refresh (bounded staleness, docs/security.md). A refresh that fails keeps the ACLs last read and logs;
`age_ms` says how old they are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from coordinator.security.authorizer import (Acl, Acls, Authorizer, Operation, PatternType, Permission,
                                             ResourceType)
from coordinator.security.clusters import secured

log = logging.getLogger("coordinator.security")

DEFAULT_REFRESH_INTERVAL_MS = 10_000
# librdkafka names the cluster resource BROKER (its code is Kafka's CLUSTER, 4)
_RESOURCE_TYPES = {4: ResourceType.CLUSTER}


_NO_CLUSTER_DESCRIBE = (
    "the cluster has an authorizer, and the coordinator's principal may not read its ACLs: grant it DESCRIBE on the "
    "cluster (kafka-acls --add --allow-principal <principal> --operation Describe --cluster), docs/security.md")


class AclAccessError(Exception):
    """The cluster will not tell us its ACLs: one line, naming the right that is missing."""


def _acl(binding: Any) -> Acl:
    resource_code = int(binding.restype.value)
    operation_code = int(binding.operation.value)
    return Acl(_RESOURCE_TYPES.get(resource_code) or ResourceType(resource_code), binding.name,
               PatternType(int(binding.resource_pattern_type.value)), binding.principal, binding.host,
               Operation(operation_code) if operation_code in Operation._value2member_map_ else Operation.UNKNOWN,
               Permission(int(binding.permission_type.value)))


class AclCache:
    def __init__(self, bootstrap: str, authorizer: Authorizer,
                 refresh_interval_ms: int = DEFAULT_REFRESH_INTERVAL_MS, timeout_s: float = 30.0) -> None:
        self.bootstrap = bootstrap
        self.authorizer = authorizer
        self.refresh_interval_ms = refresh_interval_ms
        self.timeout_s = timeout_s
        self.loaded_at: float | None = None  # monotonic seconds of the last successful read
        self._admin: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def age_ms(self) -> float | None:
        """How old the ACLs in force are (None before the first read)."""
        return None if self.loaded_at is None else (time.monotonic() - self.loaded_at) * 1000

    async def start(self) -> None:
        """The first read, before any client is served (AclAccessError if refused), then the refreshes."""
        from confluent_kafka.admin import AdminClient

        self._admin = AdminClient(secured({"bootstrap.servers": self.bootstrap,
                                           "client.id": "group-coordinator-acls"}))
        try:
            await self.refresh()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
                raise AclAccessError(_NO_CLUSTER_DESCRIBE) from None
            raise AclAccessError(f"could not read the cluster's ACLs (DescribeAcls): {exc}") from None
        self._task = asyncio.get_running_loop().create_task(self._refresh_forever(), name="acl-refresh")

    async def refresh(self) -> None:
        from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType,
                                           ResourceType as KafkaResourceType)

        everything = AclBindingFilter(KafkaResourceType.ANY, None, ResourcePatternType.ANY,  # type: ignore[arg-type]
                                      None, None, AclOperation.ANY, AclPermissionType.ANY)  # type: ignore[arg-type]
        try:
            bindings = await asyncio.wait_for(asyncio.wrap_future(
                self._admin.describe_acls(everything, request_timeout=self.timeout_s)), self.timeout_s + 5)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not (isinstance(error, KafkaError) and error.code() == KafkaError.SECURITY_DISABLED):
                raise
            if self.authorizer.enforcing or self.loaded_at is None:
                log.info("event=acls_not_enforced reason=the cluster has no authorizer (DescribeAcls: "
                         "SECURITY_DISABLED)")
            self.authorizer.use(None)
        else:
            await self._check_cluster_describe()
            acls = Acls(_acl(binding) for binding in bindings)
            if not self.authorizer.enforcing or acls.count != self.authorizer.acls.count:
                log.info("event=acls_loaded acls=%d super_users=%d allow_everyone_if_no_acl_found=%s",
                         acls.count, len(self.authorizer.super_users), self.authorizer.allow_if_no_acl)
            self.authorizer.use(acls)
        self.loaded_at = time.monotonic()

    async def _check_cluster_describe(self) -> None:
        from confluent_kafka.admin import AclOperation

        cluster = await asyncio.wait_for(asyncio.wrap_future(self._admin.describe_cluster(
            include_authorized_operations=True, request_timeout=self.timeout_s)), self.timeout_s + 5)
        if AclOperation.DESCRIBE not in (cluster.authorized_operations or ()):
            raise AclAccessError(_NO_CLUSTER_DESCRIBE)

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval_ms / 1000)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the ACLs last read stay in force
                log.warning("event=acl_refresh_failed age_ms=%.0f error=%s", self.age_ms or 0, exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._admin = None  # destroyed here, on the loop's thread
