"""The security flags of `coordinator serve` reach the service's options: --command-config (or its environment
variable), our listener's protocol and TLS from --config or --config-file, and the refusals that need no Kafka."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from coordinator.cli import build_parser
from coordinator.commands.serve import _service_options
from coordinator.embedded.certificates import CertificateSet, make_test_certificates
from coordinator.security.sasl_passthrough import ReauthLimits


def options_of(*argv: str):  # type: ignore[no-untyped-def]
    return _service_options(build_parser().parse_args(["serve", "--bootstrap-server", "k:9092", *argv]))


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> CertificateSet:
    return make_test_certificates(tmp_path_factory.mktemp("settings"))


def test_command_config_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=p\n")
    monkeypatch.setenv("COORDINATOR_COMMAND_CONFIG", str(config))
    security = options_of().client_security
    assert (security.protocol, security.mechanism, security.username) == ("SASL_PLAINTEXT", "PLAIN", "u")
    assert options_of("--command-config", str(config)).client_security == security


def test_no_command_config_is_plaintext() -> None:
    assert options_of().client_security is None


def test_listener_tls_from_a_config_file_and_the_command_line_wins(certificates: CertificateSet,
                                                                   tmp_path: Path) -> None:
    server_properties = tmp_path / "server.properties"
    server_properties.write_text(f"ssl.keystore.type=PEM\nssl.keystore.location={certificates.broker_keystore}\n"
                                 f"ssl.truststore.location={certificates.ca}\nssl.client.auth=required\n"
                                 f"group.max.size=7\n")
    options = options_of("--listen", "SSL://127.0.0.1:0", "--config-file", str(server_properties),
                         "--config", "ssl.client.auth=requested")
    assert options.server.ssl_context.verify_mode == ssl.CERT_OPTIONAL
    assert options.group.group_max_size == 7 and not options.server.sasl_passthrough


def test_a_sasl_listener_passes_through_and_needs_the_relay_and_a_sasl_cluster(certificates: CertificateSet,
                                                                              tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=p\n")
    options = options_of("--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--command-config", str(config))
    assert options.server.sasl_passthrough and options.relay.sasl_passthrough and options.server.ssl_context is None
    with pytest.raises(SystemExit, match="needs the relay"):
        options_of("--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--command-config", str(config), "--no-relay")
    with pytest.raises(SystemExit, match="needs the relay and a SASL cluster"):
        options_of("--listen", "SASL_PLAINTEXT://127.0.0.1:0")


def test_an_ssl_listener_without_a_keystore_is_refused_naming_the_setting() -> None:
    with pytest.raises(SystemExit, match=r"--listen SSL://127.0.0.1:0: ssl.keystore.location: needed"):
        options_of("--listen", "SSL://127.0.0.1:0")


def test_authorization_settings_by_their_broker_names_reach_the_listener() -> None:
    access = options_of("--config", "super.users=User:admin; User:ops", "--config",
                        "allow.everyone.if.no.acl.found=true", "--config", "acl.refresh.interval.ms=2500",
                        "--config", "ssl.principal.mapping.rules=RULE:^CN=([^,]*).*$/$1/L,DEFAULT",
                        "--config", "sasl.enabled.mechanisms=scram-sha-512",
                        "--config", "sasl.oauthbearer.sub.claim.name=client_id").server.access
    assert access.oauthbearer_claim == "client_id"
    assert access.super_users == {"User:admin", "User:ops"} and access.allow_everyone_if_no_acl_found
    assert access.refresh_interval_ms == 2500 and access.sasl_mechanisms == ("SCRAM-SHA-512",)
    assert access.principal_mapper.name("CN=Bob,O=x") == "bob"
    authorizer = access.authorizer()
    assert authorizer.super_users == access.super_users and authorizer.allow_if_no_acl


@pytest.mark.parametrize("setting, named", [
    ("sasl.enabled.mechanisms=GSSAPI", "sasl.enabled.mechanisms"),
    ("allow.everyone.if.no.acl.found=yes", "allow.everyone.if.no.acl.found"),
    ("acl.refresh.interval.ms=10", "acl.refresh.interval.ms"),
    ("ssl.principal.mapping.rules=RULE:^CN=(.*$/$1/", "ssl.principal.mapping.rules"),
])
def test_a_bad_authorization_setting_is_refused_naming_it(setting: str, named: str) -> None:
    with pytest.raises(SystemExit, match=named):
        options_of("--config", setting)


def test_connections_max_reauth_ms_per_listener_and_mechanism_as_kafka_looks_it_up(
        certificates: CertificateSet, caplog: pytest.LogCaptureFixture) -> None:
    """SaslChannelBuilder: listener.name.<l>.<mechanism>.connections.max.reauth.ms, else the listener's own
    (listener.name.<l>.connections.max.reauth.ms), else the broker-wide value; other listeners' are not ours."""
    def limits(*settings: str, listen: str = "SASL_SSL://127.0.0.1:0") -> ReauthLimits:
        tls = ("ssl.keystore.type=PEM", f"ssl.keystore.location={certificates.broker_keystore}") \
            if listen.startswith("SASL_SSL") else ()
        access = options_of("--listen", listen, "--command-config", "/dev/null",
                            *(arg for setting in (*tls, *settings) for arg in ("--config", setting)))
        return access.server.access.max_reauth_ms

    assert limits() == ReauthLimits(0)
    assert limits("connections.max.reauth.ms=60000") == ReauthLimits(60_000)
    chosen = limits("connections.max.reauth.ms=60000", "listener.name.sasl_ssl.connections.max.reauth.ms=50000",
                    "listener.name.sasl_ssl.scram-sha-256.connections.max.reauth.ms=2000",
                    "listener.name.sasl_plaintext.plain.connections.max.reauth.ms=1000")
    assert [chosen.for_mechanism(m) for m in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")] == [2000, 50_000, 50_000]
    assert "key=listener.name.sasl_plaintext.plain.connections.max.reauth.ms reason=no listener sasl_plaintext" \
        in caplog.text
    plaintext = limits("listener.name.sasl_plaintext.plain.connections.max.reauth.ms=1000",
                       listen="SASL_PLAINTEXT://127.0.0.1:0")
    assert plaintext.for_mechanism("PLAIN") == 1000 and plaintext.for_mechanism("SCRAM-SHA-512") == 0
    with pytest.raises(SystemExit, match="listener.name.SASL_SSL.connections.max.reauth.ms: Kafka reads listener "
                                         "and mechanism names here in lower case"):
        limits("listener.name.SASL_SSL.connections.max.reauth.ms=1000")
    with pytest.raises(SystemExit, match="scram-sha-256.connections.max.reauth.ms: '-1': milliseconds"):
        limits("listener.name.sasl_ssl.scram-sha-256.connections.max.reauth.ms=-1")
    with pytest.raises(SystemExit, match="unknown coordinator config"):  # not Kafka's either: it has no listener
        limits("scram-sha-256.connections.max.reauth.ms=1000")
