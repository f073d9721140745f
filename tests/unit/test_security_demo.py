"""The secured demo's pieces that need no broker: the coordinator's options it derives, aiokafka's settings from a
client properties file, the kept test CA renewed before it expires, and `demo --secure` refusing settings of yours."""

from __future__ import annotations

import dataclasses
import datetime
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.app import ServiceOptions
from coordinator.embedded.broker import EmbeddedKafka
from coordinator.embedded.certificates import expiring, make_test_certificates
from coordinator.embedded.secured import secure_listeners_in, write_client_properties
from coordinator.embedded.secured_demo import SecuredDemoCluster
from coordinator.relay import RelayConfig
from coordinator.security.access import AccessSettings
from coordinator.security.client_config import ClientConfigError, client_security, load_command_config
from coordinator.security.sasl_passthrough import ReauthLimits
from coordinator.server.config import ServerConfig


def demo_cluster(tmp_path: Path) -> SecuredDemoCluster:
    secure = dataclasses.replace(secure_listeners_in(tmp_path), authorizer=True)
    broker = EmbeddedKafka(str(tmp_path / "kafka"), secure=secure)  # not started: only its addresses are read
    return SecuredDemoCluster(broker, secure, write_client_properties(secure, "admin")["SASL_SSL"],
                              write_client_properties(secure, "alice")["SASL_SSL"])


def test_the_coordinator_is_secured_on_the_demo_cluster_keeping_its_address_and_own_settings(tmp_path: Path) -> None:
    cluster = demo_cluster(tmp_path)
    options = ServiceOptions(server=ServerConfig(listen_host="127.0.0.1", listen_port=0,
                                                 access=AccessSettings(max_reauth_ms=ReauthLimits(60_000))),
                             relay=RelayConfig(), kafka_data_dir=str(tmp_path / "kafka"))
    secured = cluster.service_options(options)
    assert secured.bootstrap == cluster.broker.sasl_ssl_bootstrap and secured.kafka_data_dir is None
    assert secured.client_security is not None and secured.client_security.principal == "User:admin"
    assert secured.server.listen_port == 0 and secured.server.sasl_passthrough
    assert isinstance(secured.server.ssl_context, ssl.SSLContext)
    assert secured.relay is not None and secured.relay.sasl_passthrough
    access = secured.server.access
    assert access is not None and access.super_users == {"User:admin", "User:ANONYMOUS"}  # the broker's
    assert not access.allow_everyone_if_no_acl_found and access.max_reauth_ms == ReauthLimits(60_000)  # yours kept
    with pytest.raises(ValueError, match="needs the relay"):
        cluster.service_options(dataclasses.replace(options, relay=None))
    alice = cluster.client_security()
    assert alice.client.principal == "User:alice" and alice.librdkafka["security.protocol"] == "sasl_ssl"


def test_aiokafka_settings_from_client_properties(tmp_path: Path) -> None:
    cluster = demo_cluster(tmp_path)
    alice = load_command_config(cluster.client_properties)
    context = alice.ssl_context()
    assert alice.aiokafka_settings(context) == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "alice",
        "sasl_plain_password": "alice-secret", "ssl_context": context}
    assert client_security({"security.protocol": "PLAINTEXT"}).aiokafka_settings(None) == {
        "security_protocol": "PLAINTEXT"}
    oauth = client_security({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
                             "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
                                                 " required unsecuredLoginStringClaim_sub=\"alice\";"})
    with pytest.raises(ClientConfigError, match="token provider"):
        oauth.aiokafka_settings(None)


def test_a_kept_test_ca_is_made_again_before_it_expires(tmp_path: Path) -> None:
    certificates = make_test_certificates(tmp_path / "certificates", clients=("client",))
    first_ca = certificates.ca.read_bytes()
    assert not expiring(certificates)
    assert expiring(certificates, within=datetime.timedelta(days=8))  # they last 7 days
    kept = secure_listeners_in(tmp_path).certificates
    assert kept.ca.read_bytes() == first_ca  # valid: kept for the next run
    kept.broker_keystore.write_text("not a certificate")
    renewed = secure_listeners_in(tmp_path).certificates
    assert renewed.ca.read_bytes() != first_ca and not expiring(renewed)


def test_demo_secure_refuses_a_cluster_or_security_of_yours() -> None:
    result = subprocess.run([sys.executable, "-m", "coordinator.cli", "demo", "--secure", "--bootstrap-server",
                             "broker:9093", "--listen", "SSL://127.0.0.1:0"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert "coordinator demo --secure: runs its own secured broker" in result.stderr, result.stderr
    assert "drop --bootstrap-server, --listen SSL://127.0.0.1:0" in result.stderr, result.stderr


def test_simulate_takes_a_client_properties_file_and_refuses_a_bad_one_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "client.properties"
    bad.write_text("security.protocol=SASL_SSL\n")
    result = subprocess.run([sys.executable, "-m", "coordinator.cli", "simulate", "--coordinator", "127.0.0.1:1",
                             "--command-config", str(bad), "--duration", "1"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0
    assert f"coordinator simulate: --command-config {bad}: sasl.mechanism: not set" in result.stderr, result.stderr
