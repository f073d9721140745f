"""ApiVersions (18): our ranges, straight from the handlers' SERVED_APIS, or with the relay the table it
advertises (ours for the group APIs, intersected with the cluster's for the rest: coordinator/relay/versions.py).
KIP-511 behaviour for versions we do not serve is `unsupported_version_reply`."""

from __future__ import annotations

import dataclasses
import re
from functools import cache
from typing import Any

from coordinator.relay.versions import ClusterFeatures
from coordinator.server.context import ConnectionContext
from protocol.apis import ApiKey, response_class
from protocol.codec import RequestHeader, encode_response_frame
from protocol.error_codes import Errors
from protocol.messages import ZERO_DURATION, build, error, item_class

API_KEY: ApiKey = ApiKey.API_VERSIONS
VERSIONS = (0, 4)
_FEATURES_VERSION = 3  # the features are tagged fields from v3 on (KIP-584)
# ApiVersionsRequest v3+ ClientSoftwareName/Version must look like this (Kafka's ApiVersionsRequest.isValid).
_SOFTWARE_PATTERN = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def handle(ctx: ConnectionContext, header: RequestHeader, body: Any, *,
           served: tuple[tuple[int, tuple[int, int]], ...] = ()) -> Any:
    """`served`: api key -> (min, max) of what this coordinator serves, bound in by the handlers' package."""
    version = header.api_version
    if version >= 3 and not _valid_software(body.client_software_name, body.client_software_version):
        return build(response_class(API_KEY, version), error_code=error(Errors.INVALID_REQUEST), api_keys=(),
                     throttle_time=ZERO_DURATION)
    if ctx.relay is not None:  # the cluster's features too: clients pick protocols by them (transaction.version)
        return _table_response(version, tuple(ctx.relay.advertised.items()), ctx.relay.features)
    return _table_response(version, served)


def _valid_software(name: str, version: str) -> bool:
    return bool(_SOFTWARE_PATTERN.fullmatch(name)) and bool(_SOFTWARE_PATTERN.fullmatch(version))


@cache
def _table_response(version: int, table: tuple[tuple[int, tuple[int, int]], ...],
                    features: ClusterFeatures | None = None) -> Any:
    cls = response_class(API_KEY, version)
    entry = item_class(cls, "api_keys")
    api_keys = tuple(entry(api_key=key, min_version=low, max_version=high) for key, (low, high) in table)
    response = build(cls, error_code=error(Errors.NONE), api_keys=api_keys, throttle_time=ZERO_DURATION)
    if features is None or version < _FEATURES_VERSION:
        return response
    supported, finalized = item_class(cls, "supported_features"), item_class(cls, "finalized_features")
    return dataclasses.replace(
        response,
        supported_features=tuple(supported(name=name, min_version=low, max_version=high)
                                 for name, low, high in features.supported_for(version)),
        finalized_features_epoch=features.epoch,
        finalized_features=tuple(finalized(name=name, max_version_level=high, min_version_level=low)
                                 for name, high, low in features.finalized))


def unsupported_version_reply(correlation_id: int) -> bytes:
    """KIP-511: an ApiVersions request at a version we do not serve gets UNSUPPORTED_VERSION and our ApiVersions
    range, in a v0 body behind a v0 header, so any client can read it and retry with a version we know."""
    cls = response_class(API_KEY, 0)
    entry = item_class(cls, "api_keys")(api_key=int(API_KEY), min_version=VERSIONS[0], max_version=VERSIONS[1])
    body = build(cls, error_code=error(Errors.UNSUPPORTED_VERSION), api_keys=(entry,))
    return encode_response_frame(correlation_id, 0, body)
