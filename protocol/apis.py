"""The table of Kafka APIs this coordinator serves, with their version ranges.

Everything version-related is derived from this one table: the ApiVersions response, the request header
version (v1 or v2, by the API's flexibility at that version), the response header version (v0 or v1;
ApiVersions always v0) and which kio message classes decode and encode a given (API, version).
Ranges follow Kafka 3.9 (reference §9) except OffsetCommit 2–9 and OffsetFetch 1–9 (Kafka 4.0's floor:
the older versions are ZooKeeper-only).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import cache

from kio.index import load_request_schema, load_response_schema


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
    DELETE_GROUPS = 42
    OFFSET_DELETE = 47


@dataclass(frozen=True, slots=True)
class ServedApi:
    key: ApiKey
    min_version: int
    max_version: int

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


SERVED_APIS: dict[int, ServedApi] = {
    api.key: api
    for api in (
        ServedApi(ApiKey.API_VERSIONS, 0, 4),
        ServedApi(ApiKey.METADATA, 0, 12),
        ServedApi(ApiKey.FIND_COORDINATOR, 0, 6),
        ServedApi(ApiKey.JOIN_GROUP, 0, 9),
        ServedApi(ApiKey.SYNC_GROUP, 0, 5),
        ServedApi(ApiKey.HEARTBEAT, 0, 4),
        ServedApi(ApiKey.LEAVE_GROUP, 0, 5),
        ServedApi(ApiKey.OFFSET_COMMIT, 2, 9),
        ServedApi(ApiKey.OFFSET_FETCH, 1, 9),
        ServedApi(ApiKey.DESCRIBE_GROUPS, 0, 5),
        ServedApi(ApiKey.LIST_GROUPS, 0, 5),
        ServedApi(ApiKey.DELETE_GROUPS, 0, 2),
        ServedApi(ApiKey.OFFSET_DELETE, 0, 0),
    )
}


def served_api(api_key: int) -> ServedApi | None:
    return SERVED_APIS.get(api_key)


def is_supported(api_key: int, version: int) -> bool:
    api = SERVED_APIS.get(api_key)
    return api is not None and api.supports(version)


@cache
def request_class(api_key: int, version: int) -> type:
    """The kio request payload class of a served (API, version)."""
    return load_request_schema(api_key, version)


@cache
def response_class(api_key: int, version: int) -> type:
    """The kio response payload class of a served (API, version)."""
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
