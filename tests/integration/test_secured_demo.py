"""`coordinator demo --secure` (`bash scripts/run.sh --secure`) in its short mode: the embedded broker with SASL_SSL,
SCRAM users and StandardAuthorizer, the coordinator on it as admin and listening with SASL_SSL, simulated and real
consumers (confluent-kafka, aiokafka, KIP-848) authenticated as alice through the coordinator and the relay and
allowed by ACLs; rebalances traced into the demo's Jaeger, as in the plain demo, naming alice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from coordinator.embedded.jaeger import built_jaeger
from tests.support.demo_run import processes_mentioning, run_demo_watching_jaeger


def test_the_secured_demo_runs_end_to_end_over_sasl_ssl_with_acls_and_traces(tmp_path: Path) -> None:
    if built_jaeger() is None:
        pytest.fail("the project's Jaeger build is missing: run scripts/setup.sh (it builds it once per machine)")
    state_dir = tmp_path / "state"
    result, trace, _jaeger_pid = run_demo_watching_jaeger(state_dir, "--secure", "--duration", "12", "--consumers",
                                                          "4", "--failure-rate", "10")
    output, log = result.stdout, result.stderr  # stderr: the demo's log file
    assert result.returncode == 0, output + log[-5000:]
    properties = state_dir / "kafka-secured" / "certificates" / "alice-sasl-ssl.properties"
    assert "point your consumers at bootstrap.servers=127.0.0.1:" in output
    assert f"with SASL_SSL as alice: the settings (Java's names) are in {properties}" in output
    assert "SASL_SSL with SCRAM users and StandardAuthorizer" in output
    assert "security.protocol=SASL_SSL" in properties.read_text()
    # every hop secured: the coordinator to the cluster as admin, its listener SASL_SSL, clients judged by the broker
    assert re.search(r"event=cluster_security \S+ security_protocol=SASL_SSL sasl_mechanism=SCRAM-SHA-512 "
                     r"principal=admin", log), log[-3000:]
    assert "event=listening security_protocol=SASL_SSL" in log
    assert re.search(r"event=acls_loaded acls=3 ", log), log[-3000:]  # alice's grants, StandardAuthorizer's
    principals = set(re.findall(r"event=sasl_authenticated .*?principal=(\S+)", log))
    assert principals == {"User:alice"}, principals
    assert "AUTHORIZATION_FAILED" not in output + log and "event=sasl_failed" not in log
    # the consumers did their work through it: simulated members, the relay's readers, KIP-848 consumers
    assert re.search(r"records read through the relay \(demo-real\): confluent-kafka [1-9]\d*, aiokafka [1-9]\d*",
                     output), output
    assert re.search(r"demo-kip848-0 [1-9]\d*, demo-kip848-1 [1-9]\d*", output), output
    # traced as usual, the members named by their principal
    assert trace is not None, "no rebalance trace reached the demo's Jaeger:\n" + log[-3000:]
    tags = {(tag["key"], tag["value"]) for span in trace["spans"] for tag in span.get("tags", ())}
    assert ("coordinator.client.principal", "User:alice") in tags, sorted(tags)
    assert not processes_mentioning(str(state_dir)), "the secured broker outlived the demo"

