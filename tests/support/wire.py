"""Requests our KafkaClient sends in the tests: any API and version from one set of values, and the classic
group calls (JoinGroup with the KIP-394 round trip, SyncGroup, Heartbeat) built the way a consumer builds them."""

from __future__ import annotations

import datetime
from typing import Any

from protocol import apis
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.consumer_protocol import Subscription, encode_subscription
from protocol.messages import build, item_class

SESSION_MS = 6_000


def request(api_key: int, version: int, **fields: Any) -> Any:
    """A kio request of any version from one set of values (fields the version lacks are dropped)."""
    return build(apis.request_class(api_key, version), **fields)


def nested(api_key: int, version: int, *path: str) -> type:
    cls = apis.request_class(api_key, version)
    for name in path:
        cls = item_class(cls, name)
    return cls


def ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


def subscription_metadata(*topics: str) -> bytes:
    return encode_subscription(Subscription(tuple(topics)))


async def join(client: KafkaClient, group_id: str, member_id: str = "", *, version: int = 9,
               session_timeout_ms: int = SESSION_MS, rebalance_timeout_ms: int = 10_000,
               group_instance_id: str | None = None, topics: tuple[str, ...] = ("t",)) -> Any:
    protocol = nested(ApiKey.JOIN_GROUP, version, "protocols")(name="range", metadata=subscription_metadata(*topics))
    body = request(ApiKey.JOIN_GROUP, version, group_id=group_id, session_timeout=ms(session_timeout_ms),
                   rebalance_timeout=ms(rebalance_timeout_ms), member_id=member_id,
                   group_instance_id=group_instance_id, protocol_type="consumer", protocols=(protocol,), reason=None)
    return await client.request(body)


async def join_with_member_id(client: KafkaClient, group_id: str, **options: Any) -> Any:
    """KIP-394: the first JoinGroup (v4+) gets MEMBER_ID_REQUIRED and a member id; join again with it."""
    first = await join(client, group_id, **options)
    if first.error_code != 79:
        return first
    return await join(client, group_id, first.member_id, **options)


async def sync(client: KafkaClient, group_id: str, generation_id: int, member_id: str,
               assignments: dict[str, bytes] | None = None, *, version: int = 5) -> Any:
    entry = nested(ApiKey.SYNC_GROUP, version, "assignments")
    body = request(ApiKey.SYNC_GROUP, version, group_id=group_id, generation_id=generation_id, member_id=member_id,
                   group_instance_id=None, protocol_type="consumer", protocol_name="range",
                   assignments=tuple(entry(member_id=m, assignment=a) for m, a in (assignments or {}).items()))
    return await client.request(body)


def heartbeat(group_id: str, generation_id: int, member_id: str, version: int = 4) -> Any:
    return request(ApiKey.HEARTBEAT, version, group_id=group_id, generation_id=generation_id, member_id=member_id,
                   group_instance_id=None)
