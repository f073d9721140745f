"""A static member (KIP-345: one group.instance.id) speaking the classic protocol through our client."""
from __future__ import annotations

from typing import Any

from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.error_codes import Errors
from tests.support.wire import join, nested, request

STATIC_GROUP = "static-app"
INSTANCE = "host-1"
FENCED_INSTANCE_ID = Errors.FENCED_INSTANCE_ID


async def static_client(port: int) -> tuple[KafkaClient, Any]:
    """A client that speaks ApiVersions v4 (KIP-511 name and version) before anything else."""
    client = await KafkaClient.connect("127.0.0.1", port, client_id="static-consumer", negotiate=False)
    versions = await client.request(request(ApiKey.API_VERSIONS, 4, client_software_name="e2e-static",
                                            client_software_version="1.0"))
    return client, versions


async def static_join(client: KafkaClient) -> Any:
    return await join(client, STATIC_GROUP, version=9, group_instance_id=INSTANCE, session_timeout_ms=10_000)


def static_heartbeat(generation: int, member_id: str) -> Any:
    return request(ApiKey.HEARTBEAT, 4, group_id=STATIC_GROUP, generation_id=generation, member_id=member_id,
                   group_instance_id=INSTANCE)


async def static_sync(client: KafkaClient, generation: int, member_id: str, assignment: bytes | None) -> Any:
    entry = nested(ApiKey.SYNC_GROUP, 5, "assignments")
    return await client.request(request(
        ApiKey.SYNC_GROUP, 5, group_id=STATIC_GROUP, generation_id=generation, member_id=member_id,
        group_instance_id=INSTANCE, protocol_type="consumer", protocol_name="range",
        assignments=() if assignment is None else (entry(member_id=member_id, assignment=assignment),)))
