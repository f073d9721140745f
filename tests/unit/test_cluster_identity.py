import pytest

from coordinator.cluster.identity import (InstanceEndpoint, client_id_for, default_node_id, parse_client_id,
                                          validate_instance_id)
from coordinator.relay.config import DEFAULT_NODE_ID


def test_an_endpoint_survives_its_client_id() -> None:
    endpoint = InstanceEndpoint("coord-2", default_node_id("coord-2"), "10.0.0.7", 9192)
    assert parse_client_id(client_id_for(endpoint)) == endpoint


@pytest.mark.parametrize("client_id", ["rdkafka", "group-coordinator-instance|a|x|h|1",
                                       "group-coordinator-instance|a|1|h|0", "group-coordinator-instance|a b|1|h|9",
                                       "group-coordinator-instance|a|1||9", "other|a|1|h|9"])
def test_foreign_or_malformed_client_ids_are_not_instances(client_id: str) -> None:
    assert parse_client_id(client_id) is None


def test_node_ids_are_stable_and_clear_of_brokers_and_the_single_instance() -> None:
    assert default_node_id("a") == default_node_id("a")
    assert default_node_id("a") != default_node_id("b")
    assert all(default_node_id(f"i{k}") > DEFAULT_NODE_ID for k in range(100))


def test_instance_ids_are_checked() -> None:
    assert validate_instance_id("coord-1.eu_west") == "coord-1.eu_west"
    for bad in ("", "a|b", "a b", "x" * 201):
        with pytest.raises(ValueError):
            validate_instance_id(bad)
