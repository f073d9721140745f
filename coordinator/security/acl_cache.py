"""The cluster's ACLs, read with DescribeAcls (every binding: any resource, any pattern, any principal) over a
connection of ours authenticated with the coordinator's own credentials (--command-config), and read again every
`acl.refresh.interval.ms`.

Kafka's own answer decides, so the request is ours, not librdkafka's (whose describe_acls gives an empty list both
for SECURITY_DISABLED and for CLUSTER_AUTHORIZATION_FAILED): SECURITY_DISABLED means the cluster has no authorizer,
and nothing is enforced here either, as on that cluster; CLUSTER_AUTHORIZATION_FAILED (the coordinator's principal
lacks DESCRIBE on the cluster) stops the start with one line saying so. Kafka applies an ACL change at once; here it
applies at the next refresh (bounded staleness, docs/security.md). A refresh that fails keeps the ACLs last read
and logs; `age_ms` says how old they are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from coordinator.security.authorizer import (Acl, Acls, Authorizer, Operation, PatternType, Permission,
                                             ResourceType)
from coordinator.security.clusters import cluster_security
from coordinator.security.connections import connect
from protocol import apis
from protocol.client import KafkaClient
from protocol.errors import ConnectionClosed, ProtocolError, RequestTimedOut
from protocol.messages import build

log = logging.getLogger("coordinator.security")

DEFAULT_REFRESH_INTERVAL_MS = 10_000
_DESCRIBE_ACLS = 29
_SECURITY_DISABLED = 54
_CLUSTER_AUTHORIZATION_FAILED = 31
_NO_CLUSTER_DESCRIBE = (
    "the cluster has an authorizer, and the coordinator's principal may not read its ACLs: grant it DESCRIBE on the "
    "cluster (kafka-acls --add --allow-principal <principal> --operation Describe --cluster), docs/security.md")


class AclAccessError(Exception):
    """The cluster will not tell us its ACLs: one line, naming the right that is missing."""


def _acls(response: Any) -> Acls:
    found = []
    for resource in response.resources:
        for acl in resource.acls:
            operation = int(acl.operation)
            found.append(Acl(ResourceType(int(resource.resource_type)), resource.resource_name,
                             PatternType(int(resource.pattern_type)), acl.principal, acl.host,
                             Operation(operation) if operation in Operation._value2member_map_ else Operation.UNKNOWN,
                             Permission(int(acl.permission_type))))
    return Acls(found)


class AclCache:
    def __init__(self, bootstrap: str, authorizer: Authorizer,
                 refresh_interval_ms: int = DEFAULT_REFRESH_INTERVAL_MS, timeout_s: float = 30.0) -> None:
        self.bootstrap = bootstrap
        self.authorizer = authorizer
        self.refresh_interval_ms = refresh_interval_ms
        self.timeout_s = timeout_s
        self.loaded_at: float | None = None  # monotonic seconds of the last successful read
        self._client: KafkaClient | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def age_ms(self) -> float | None:
        """How old the ACLs in force are (None before the first read)."""
        return None if self.loaded_at is None else (time.monotonic() - self.loaded_at) * 1000

    async def start(self) -> None:
        """The first read, before any client is served (AclAccessError if refused), then the refreshes."""
        try:
            await self.refresh()
        except AclAccessError:
            raise
        except (OSError, asyncio.TimeoutError, ConnectionClosed, RequestTimedOut, ProtocolError) as exc:
            raise AclAccessError(f"could not read the cluster's ACLs (DescribeAcls): {exc!r}") from None
        self._task = asyncio.get_running_loop().create_task(self._refresh_forever(), name="acl-refresh")

    async def refresh(self) -> None:
        try:
            response = await self._describe_acls()
        except (ConnectionClosed, OSError):  # e.g. the broker ended the session (connections.max.reauth.ms)
            response = await self._describe_acls()  # once more, on a new connection
        code = int(response.error_code)
        if code == _SECURITY_DISABLED:
            if self.authorizer.enforcing or self.loaded_at is None:
                log.info("event=acls_not_enforced reason=the cluster has no authorizer (DescribeAcls: "
                         "SECURITY_DISABLED)")
            self.authorizer.use(None)
        elif code == _CLUSTER_AUTHORIZATION_FAILED:
            raise AclAccessError(_NO_CLUSTER_DESCRIBE)
        elif code != 0:
            raise AclAccessError(f"DescribeAcls failed with error code {code}: {response.error_message}")
        else:
            acls = _acls(response)
            if not self.authorizer.enforcing or acls.count != self.authorizer.acls.count:
                log.info("event=acls_loaded acls=%d super_users=%d allow_everyone_if_no_acl_found=%s",
                         acls.count, len(self.authorizer.super_users), self.authorizer.allow_if_no_acl)
            self.authorizer.use(acls)
        self.loaded_at = time.monotonic()

    async def _describe_acls(self) -> Any:
        if self._client is None or self._client.is_closed:
            self._client = await self._connect()
        version = self._client.version_for(_DESCRIBE_ACLS, 3)
        request = build(apis.request_class(_DESCRIBE_ACLS, version), resource_type_filter=1,  # ANY
                        resource_name_filter=None, pattern_type_filter=1, principal_filter=None,  # ANY
                        host_filter=None, operation=1, permission_type=1)  # ANY, ANY
        try:
            return await self._client.request(request, timeout_ms=int(self.timeout_s * 1000))
        except BaseException:
            await self._client.abort()
            self._client = None
            raise

    async def _connect(self) -> KafkaClient:
        """The first bootstrap broker that answers."""
        failure: BaseException | None = None
        for address in (part.strip() for part in self.bootstrap.split(",") if part.strip()):
            host, _, port = address.rpartition(":")
            try:
                return await asyncio.wait_for(connect(host.strip("[]"), int(port), cluster_security(self.bootstrap),
                                                      client_id="group-coordinator-acls",
                                                      timeout_ms=int(self.timeout_s * 1000)), self.timeout_s)
            except (OSError, asyncio.TimeoutError, ConnectionClosed, RequestTimedOut, ProtocolError) as exc:
                failure = exc
        raise failure or OSError(f"no bootstrap address in {self.bootstrap!r}")

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_interval_ms / 1000)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the ACLs last read stay in force
                log.warning("event=acl_refresh_failed age_ms=%.0f error=%r", self.age_ms or 0, exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._client is not None:
            await self._client.close()
            self._client = None
