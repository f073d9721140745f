"""Consumer groups' configurations as the cluster holds them (KIP-848's dynamic group configs), for the cache in
coordinator/group/modern/group_configs.py: read with DescribeConfigs on GROUP resources over the relay's control
connection, and learnt to be altered from the (Incremental)AlterConfigs answers the relay forwards.

A Kafka 4.1 broker answers DescribeConfigs for any group name, existing or not: every group config with the
broker's default (source DEFAULT_CONFIG), or the group's own value (source GROUP_CONFIG) where one is set; an
empty name gets INVALID_REQUEST "Group name must not be empty"; a principal without DESCRIBE_CONFIGS on the group
gets GROUP_AUTHORIZATION_FAILED for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from coordinator.group_configs import Described
from protocol import apis
from protocol.codec import skip_tagged_fields
from protocol.messages import build, item_class
from protocol.tolerant import read_entity

if TYPE_CHECKING:
    from coordinator.relay.relay import Relay

log = logging.getLogger("coordinator.relay")

GROUP_RESOURCE = 32  # ConfigResource.Type.GROUP
GROUP_CONFIG_SOURCE = 8  # DescribeConfigs' ConfigSource.GROUP_CONFIG: set on the group itself
DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
INCREMENTAL_ALTER_CONFIGS = 44
ALTERING_CONFIGS = frozenset({ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS})

_HIGHEST_DESCRIBE = 4
_FIRST_WITH_SOURCES = 1  # v0 has IsDefault instead of ConfigSource (and Kafka 4 no longer serves it)
_SIZE_AND_CORRELATION = 8


async def describe_group_configs(relay: Relay, group_ids: list[str], names: tuple[str, ...]
                                 ) -> dict[str, Described]:
    """Each group's values set on it (name -> value), or the error code the cluster answered for it."""
    low, high = relay.advertised.get(DESCRIBE_CONFIGS, (_FIRST_WITH_SOURCES, _HIGHEST_DESCRIBE))
    version = max(min(high, _HIGHEST_DESCRIBE), _FIRST_WITH_SOURCES, low)
    request_class = apis.request_class(DESCRIBE_CONFIGS, version)
    resource_class = item_class(request_class, "resources")
    body = build(request_class, resources=tuple(
        resource_class(resource_type=GROUP_RESOURCE, resource_name=group_id, configuration_keys=names)
        for group_id in group_ids), include_synonyms=False, include_documentation=False)
    response = await relay.request(body)
    described: dict[str, Described] = {}
    for result in response.results:
        if int(result.error_code) != 0:
            described[result.resource_name] = int(result.error_code)
            continue
        described[result.resource_name] = {config.name: config.value for config in result.configs
                                           if int(config.config_source) == GROUP_CONFIG_SOURCE
                                           and config.value is not None}
    return described


def alteration_observer(api_key: int, version: int, altered: Callable[[list[str]], None]
                        ) -> Callable[[memoryview], None]:
    """What the relay applies to an (Incremental)AlterConfigs answer on its way to the client: tells `altered`
    which groups' configurations were changed, and lets the answer through as it is."""

    def observe(frame: memoryview) -> None:
        try:
            groups = altered_groups(frame, api_key, version)
        except Exception as exc:  # the client gets the answer whatever it holds
            log.warning("event=config_alteration_unread api_key=%d version=%d error=%r detail=groups altered by it "
                        "are read again at their next refresh", api_key, version, exc)
            return None
        if groups:
            altered(groups)
        return None

    return observe


def altered_groups(frame: memoryview, api_key: int, version: int) -> list[str]:
    """The GROUP resources an (Incremental)AlterConfigs answer (size prefix included) reports altered."""
    raw = bytes(frame)
    offset = _SIZE_AND_CORRELATION
    if apis.response_header_version(api_key, version) >= 1:
        offset = skip_tagged_fields(raw, offset)
    body: Any
    body, _end = read_entity(apis.response_class(api_key, version), raw, offset)
    return [str(result.resource_name) for result in body.responses
            if int(result.resource_type) == GROUP_RESOURCE and int(result.error_code) == 0]
