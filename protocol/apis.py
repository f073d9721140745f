"""Kafka API keys and what depends only on (API, version): the kio message classes, flexibility, the request and
response header versions (v1 or v2 by the API's flexibility at that version; ApiVersions' response always v0).

Which APIs and versions the coordinator *serves* is not decided here: each handler declares its range beside it
(coordinator/server/handlers, SERVED_APIS) and the relay declares what it forwards (coordinator/relay/versions.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cache

from kio.index import load_request_schema, load_response_schema
from kio.static.protocol import Entity


class ApiKey(enum.IntEnum):
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    METADATA = 3
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    API_VERSIONS = 18
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    TXN_OFFSET_COMMIT = 28
    DELETE_GROUPS = 42
    OFFSET_DELETE = 47
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69


@dataclass(frozen=True, slots=True)
class ServedApi:
    key: ApiKey
    min_version: int
    max_version: int


@cache
def request_class(api_key: int, version: int) -> type[Entity]:
    """The kio request payload class of an (API, version); kio.index.KioIndexError if kio has none."""
    return load_request_schema(api_key, version)


@cache
def response_class(api_key: int, version: int) -> type[Entity]:
    """The kio response payload class of an (API, version)."""
    return load_response_schema(api_key, version)


def is_flexible(api_key: int, version: int) -> bool:
    """Flexible versions use compact strings/arrays and tagged fields, request header v2, response header v1."""
    return bool(request_class(api_key, version).__flexible__)


def request_header_version(api_key: int, version: int) -> int:
    return 2 if is_flexible(api_key, version) else 1


def response_header_version(api_key: int, version: int) -> int:
    # ApiVersionsResponse always has a v0 header so that a client can read it before it knows our versions.
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if is_flexible(api_key, version) else 0
