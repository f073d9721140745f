"""`coordinator serve --config NAME=VALUE`: every Kafka name it accepts is honoured, anything else is refused with
the name in the message. (The replication factor on a real 3-broker cluster: tests/integration/
test_embedded_cluster.py.)"""

from __future__ import annotations

import pytest

from coordinator.app import ServiceOptions, _kafka_store, _storage_config
from coordinator.cli import build_parser
from coordinator.commands.serve import _service_options
from coordinator.config import CoordinatorConfig
from coordinator.storage.loader import consumer_settings


def options_of(*argv: str) -> ServiceOptions:
    return _service_options(build_parser().parse_args(["serve", "--bootstrap-server", "k:9092", *argv]))


def refusal_of(*argv: str) -> str:
    with pytest.raises(SystemExit) as refused:
        options_of(*argv)
    return str(refused.value)


def test_an_unknown_name_is_refused_with_the_names_accepted() -> None:
    message = refusal_of("--config", "offsets.topic.compression.type=lz4")
    assert "unknown coordinator config 'offsets.topic.compression.type'" in message
    for accepted in ("offsets.topic.replication.factor", "offsets.load.buffer.size", "group.max.size"):
        assert accepted in message


@pytest.mark.parametrize("setting, reason", [
    ("offsets.topic.compression.codec=1", "offsets.topic.compression.codec=1 is not supported"),
    ("offsets.topic.compression.codec=4", "written uncompressed (0)"),
    ("offsets.topic.replication.factor=0", "offsets.topic.replication.factor must be at least 1"),
    ("offsets.load.buffer.size=0", "offsets.load.buffer.size must be at least 1"),
])
def test_a_value_the_coordinator_cannot_honour_is_refused_with_its_name(setting: str, reason: str) -> None:
    message = refusal_of("--config", setting)
    assert message.startswith("coordinator serve: bad --config: ") and reason in message


def test_the_uncompressed_codec_is_accepted() -> None:
    assert options_of("--config", "offsets.topic.compression.codec=0").group.offsets_topic_compression_codec == 0


def test_the_replication_factor_reaches_the_state_topic_settings() -> None:
    assert _storage_config(options_of(), "k:9092").replication_factor is None  # min(3, brokers) when created
    chosen = options_of("--config", "offsets.topic.replication.factor=2")
    assert _storage_config(chosen, "k:9092").replication_factor == 2
    assert _storage_config(options_of("--state-replication-factor", "1"), "k:9092").replication_factor == 1
    same = options_of("--state-replication-factor", "2", "--config", "offsets.topic.replication.factor=2")
    assert _storage_config(same, "k:9092").replication_factor == 2


def test_two_different_replication_factors_are_refused() -> None:
    message = refusal_of("--state-replication-factor", "1", "--config", "offsets.topic.replication.factor=3")
    assert "--state-replication-factor and --config offsets.topic.replication.factor disagree" in message


def test_the_load_buffer_size_is_the_loaders_fetch_size() -> None:
    default = options_of()
    assert _kafka_store(default, _storage_config(default, "k:9092")).load_buffer_bytes == \
        CoordinatorConfig().offsets_load_buffer_size
    options = options_of("--config", "offsets.load.buffer.size=1048576")
    store = _kafka_store(options, _storage_config(options, "k:9092"))
    assert store.load_buffer_bytes == 1_048_576
    settings = consumer_settings("k:9092", "c", store.load_buffer_bytes)
    assert settings["max.partition.fetch.bytes"] == 1_048_576
