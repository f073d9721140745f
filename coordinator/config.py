"""Coordinator configuration: Kafka's broker config names and defaults (Kafka 3.9 `GroupCoordinatorConfig`).

Every field carries its Kafka property name in `metadata["kafka"]`, so a `server.properties`-style mapping can
be applied with `CoordinatorConfig.from_properties`; a name not listed here is refused, and so is a value the
coordinator cannot honour. Durations end in `_ms` (retention is in minutes, like Kafka).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

INT32_MAX = 2_147_483_647
INT16_MAX = 32_767
# Kafka 4.1's built-in consumer group assignors: each may be named by its name or by its Java class name
BUILTIN_ASSIGNORS = {"uniform": "org.apache.kafka.coordinator.group.assignor.UniformAssignor",
                     "range": "org.apache.kafka.coordinator.group.assignor.RangeAssignor"}
_ASSIGNOR_BY_CLASS = {class_name: name for name, class_name in BUILTIN_ASSIGNORS.items()}


def _kafka(name: str, default: Any) -> Any:
    return field(default=default, metadata={"kafka": name})


@dataclass(frozen=True)
class CoordinatorConfig:
    group_min_session_timeout_ms: int = _kafka("group.min.session.timeout.ms", 6_000)
    group_max_session_timeout_ms: int = _kafka("group.max.session.timeout.ms", 1_800_000)
    group_initial_rebalance_delay_ms: int = _kafka("group.initial.rebalance.delay.ms", 3_000)
    group_max_size: int = _kafka("group.max.size", INT32_MAX)
    offsets_topic_num_partitions: int = _kafka("offsets.topic.num.partitions", 50)
    # None: min(3, brokers). Kafka's default is 3, which a cluster of fewer brokers cannot create.
    offsets_topic_replication_factor: int | None = _kafka("offsets.topic.replication.factor", None)
    offsets_topic_segment_bytes: int = _kafka("offsets.topic.segment.bytes", 104_857_600)
    # State records are written uncompressed (Kafka's default, 0): the only codec accepted.
    offsets_topic_compression_codec: int = _kafka("offsets.topic.compression.codec", 0)
    offsets_retention_minutes: int = _kafka("offsets.retention.minutes", 10_080)
    offsets_retention_check_interval_ms: int = _kafka("offsets.retention.check.interval.ms", 600_000)
    offsets_commit_timeout_ms: int = _kafka("offsets.commit.timeout.ms", 5_000)
    offsets_load_buffer_size: int = _kafka("offsets.load.buffer.size", 5_242_880)  # the loader's fetch size
    offset_metadata_max_bytes: int = _kafka("offset.metadata.max.bytes", 4_096)
    # Consumer groups (KIP-848), Kafka 4.1's GroupCoordinatorConfig defaults.
    group_consumer_session_timeout_ms: int = _kafka("group.consumer.session.timeout.ms", 45_000)
    group_consumer_min_session_timeout_ms: int = _kafka("group.consumer.min.session.timeout.ms", 45_000)
    group_consumer_max_session_timeout_ms: int = _kafka("group.consumer.max.session.timeout.ms", 60_000)
    group_consumer_heartbeat_interval_ms: int = _kafka("group.consumer.heartbeat.interval.ms", 5_000)
    group_consumer_min_heartbeat_interval_ms: int = _kafka("group.consumer.min.heartbeat.interval.ms", 5_000)
    group_consumer_max_heartbeat_interval_ms: int = _kafka("group.consumer.max.heartbeat.interval.ms", 15_000)
    group_consumer_max_size: int = _kafka("group.consumer.max.size", INT32_MAX)
    # bidirectional | upgrade | downgrade | disabled: which online conversions between a classic group and a
    # consumer group are allowed (coordinator/group/modern/conversion.py)
    group_consumer_migration_policy: str = _kafka("group.consumer.migration.policy", "bidirectional")
    # the server-side assignors ConsumerGroupHeartbeat may name, the first being the default (a Kafka LIST: names
    # separated by commas); Kafka's built-in ones only, by name or class name (a custom Java class cannot run here)
    group_consumer_assignors: tuple[str, ...] = _kafka("group.consumer.assignors", ("uniform", "range"))
    # how often a group's regular expressions are resolved again even when no topic was created (an internal
    # Kafka config, at least 10 s)
    group_consumer_regex_refresh_interval_ms: int = _kafka("group.consumer.regex.refresh.interval.ms", 600_000)
    # The coordinator's own (not Kafka's): how old a group's configuration (`kafka-configs --entity-type groups`,
    # read from the cluster with DescribeConfigs) may get before a heartbeat has it read again, and how many
    # groups' configurations are kept (the least recently read go first)
    group_config_refresh_interval_ms: int = _kafka("group.config.refresh.interval.ms", 10_000)
    group_config_max_groups: int = _kafka("group.config.max.groups", 100_000)
    # Kafka constants, not broker configs; overridable here for tests.
    new_member_join_timeout_ms: int = _kafka("NewMemberJoinTimeoutMs", 300_000)
    purgatory_purge_interval: int = _kafka("purgeInterval", 1_000)

    def __post_init__(self) -> None:
        if self.group_max_size < 1:
            raise ValueError("group.max.size must be at least 1")
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ValueError("group.min.session.timeout.ms exceeds group.max.session.timeout.ms")
        self._check_consumer_group_timeouts()
        if self.offsets_topic_num_partitions < 1:
            raise ValueError("offsets.topic.num.partitions must be at least 1")
        if self.offsets_topic_replication_factor is not None and self.offsets_topic_replication_factor < 1:
            raise ValueError("offsets.topic.replication.factor must be at least 1")
        if self.offsets_topic_compression_codec != 0:
            raise ValueError(f"offsets.topic.compression.codec={self.offsets_topic_compression_codec} is not "
                             "supported: the state topic is written uncompressed (0)")
        if self.group_consumer_migration_policy.lower() not in ("bidirectional", "upgrade", "downgrade", "disabled"):
            raise ValueError("group.consumer.migration.policy must be one of bidirectional, upgrade, downgrade, "
                             f"disabled, got {self.group_consumer_migration_policy}")
        self._check_consumer_group_assignors()
        if self.group_consumer_regex_refresh_interval_ms < 10_000:
            raise ValueError("group.consumer.regex.refresh.interval.ms must be at least 10000")
        if self.group_config_refresh_interval_ms < 1:
            raise ValueError("group.config.refresh.interval.ms must be at least 1")
        if self.group_config_max_groups < 1:
            raise ValueError("group.config.max.groups must be at least 1")
        if self.offsets_load_buffer_size < 1:
            raise ValueError("offsets.load.buffer.size must be at least 1")
        # the record's metadata is an int16-length string (OffsetCommitValue): a longer one cannot be stored
        if not 0 <= self.offset_metadata_max_bytes <= INT16_MAX:
            raise ValueError(f"offset.metadata.max.bytes must be within 0..{INT16_MAX}")

    def _check_consumer_group_timeouts(self) -> None:
        """Kafka's GroupCoordinatorConfig checks: each value within its min and max, the interval below the
        session timeout."""
        for name, value, low, high in (
                ("session.timeout.ms", self.group_consumer_session_timeout_ms,
                 self.group_consumer_min_session_timeout_ms, self.group_consumer_max_session_timeout_ms),
                ("heartbeat.interval.ms", self.group_consumer_heartbeat_interval_ms,
                 self.group_consumer_min_heartbeat_interval_ms, self.group_consumer_max_heartbeat_interval_ms)):
            if not low <= value <= high:
                raise ValueError(f"group.consumer.{name} must be within group.consumer.min.{name} ({low}) and "
                                 f"group.consumer.max.{name} ({high}), got {value}")
        if self.group_consumer_heartbeat_interval_ms >= self.group_consumer_session_timeout_ms:
            raise ValueError("group.consumer.heartbeat.interval.ms must be less than "
                             "group.consumer.session.timeout.ms")

    def _check_consumer_group_assignors(self) -> None:
        """Kafka builds one assignor per entry and maps them by name (a name given twice stops its start);
        the first is the default, so there must be one."""
        names = self.consumer_group_assignor_names
        if not names:
            raise ValueError("group.consumer.assignors must name at least one assignor")
        if len(set(names)) != len(names):
            raise ValueError("group.consumer.assignors names an assignor twice: "
                             + ", ".join(self.group_consumer_assignors))

    @property
    def consumer_group_assignor_names(self) -> tuple[str, ...]:
        """`group.consumer.assignors` as assignor names, in the order given (the first is the default)."""
        names = []
        for entry in self.group_consumer_assignors:
            name = entry if entry in BUILTIN_ASSIGNORS else _ASSIGNOR_BY_CLASS.get(entry)
            if name is None:
                raise ValueError(f"group.consumer.assignors: {entry!r} is not one of Kafka's built-in assignors "
                                 f"({', '.join(f'{n} ({c})' for n, c in BUILTIN_ASSIGNORS.items())}); a custom "
                                 "assignor class cannot run in this coordinator")
            names.append(name)
        return tuple(names)

    @property
    def offsets_retention_ms(self) -> int:
        return self.offsets_retention_minutes * 60_000

    @staticmethod
    def kafka_names() -> dict[str, str]:
        """Kafka property name -> field name."""
        return {f.metadata["kafka"]: f.name for f in dataclasses.fields(CoordinatorConfig)}

    @classmethod
    def from_properties(cls, props: Mapping[str, str | int], base: CoordinatorConfig | None = None) -> CoordinatorConfig:
        """Apply Kafka-named properties (e.g. from a server.properties file); unknown names raise KeyError."""
        names = cls.kafka_names()
        fields = dataclasses.fields(cls)
        text_fields = {f.name for f in fields if isinstance(f.default, str)}
        list_fields = {f.name for f in fields if isinstance(f.default, tuple)}
        overrides: dict[str, Any] = {}
        for name, value in props.items():
            field_name = names[name]
            overrides[field_name] = (value if field_name in text_fields
                                     else _kafka_list(value) if field_name in list_fields else int(value))
        return dataclasses.replace(base or cls(), **overrides)


def _kafka_list(value: str | int | tuple[str, ...]) -> tuple[str, ...]:
    """A Kafka LIST value: entries separated by commas, the whitespace around them dropped; "" is no entry."""
    if isinstance(value, tuple):
        return value
    text = str(value).strip()
    return tuple(entry.strip() for entry in text.split(",")) if text else ()
