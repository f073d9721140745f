"""--command-config: Kafka client properties (Java's and librdkafka's names) read, checked with errors naming the
key, and translated to librdkafka settings and our own TLS/SASL; SCRAM against RFC 7677's worked example."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from coordinator.security import sasl_client
from coordinator.security.client_config import ClientConfigError, client_security, load_command_config
from coordinator.security.clusters import secured, use_for_cluster
from coordinator.security.properties import parse_properties

SCRAM_JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="s3cr=t;";'
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_text(CA_PEM)
    return path


def test_java_properties_syntax_continuations_comments_and_escapes() -> None:
    text = ("# a comment\n! another\n  security.protocol = SASL_SSL\nsasl.mechanism:SCRAM-SHA-512\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
            "    username=\"alice\" \\\n    password=\"a\\\\b\";\nkey\\ with\\ space value\nempty=\n")
    assert parse_properties(text) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" '
                            'password="a\\b";',
        "key with space": "value", "empty": ""}


def test_java_names_translate_to_librdkafka(ca_file: Path) -> None:
    security = client_security({"security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-256",
                                "sasl.jaas.config": SCRAM_JAAS, "ssl.truststore.type": "PEM",
                                "ssl.truststore.location": str(ca_file)})
    assert security.librdkafka_settings() == {
        "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
        "sasl.password": "s3cr=t;", "ssl.ca.location": str(ca_file.resolve()),
        "ssl.endpoint.identification.algorithm": "https"}


def test_librdkafka_names_are_accepted(ca_file: Path, tmp_path: Path) -> None:
    keystore = tmp_path / "me.pem"
    keystore.write_text("-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n" + CA_PEM)
    security = client_security({"security.protocol": "SASL_SSL", "sasl.mechanisms": "PLAIN",
                                "sasl.username": "bob", "sasl.password": "pw", "ssl.ca.location": str(ca_file),
                                "ssl.certificate.location": str(keystore), "ssl.key.location": str(keystore),
                                "ssl.endpoint.identification.algorithm": "none"})
    settings = security.librdkafka_settings()
    assert (settings["sasl.mechanism"], settings["sasl.username"], settings["sasl.password"]) == ("PLAIN", "bob", "pw")
    assert settings["ssl.certificate.location"] == settings["ssl.key.location"] == str(keystore.resolve())
    assert settings["ssl.endpoint.identification.algorithm"] == "none"


def test_pem_keystore_is_key_and_chain_in_one_file(ca_file: Path, tmp_path: Path) -> None:
    keystore = tmp_path / "client.pem"
    keystore.write_text("-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n" + CA_PEM)
    security = client_security({"security.protocol": "SSL", "ssl.truststore.location": str(ca_file),
                                "ssl.keystore.type": "PEM", "ssl.keystore.location": str(keystore),
                                "ssl.key.password": "kp"})
    assert security.librdkafka_settings()["ssl.key.location"] == str(keystore.resolve())
    assert security.librdkafka_settings()["ssl.key.password"] == "kp"
    certificate_only = tmp_path / "cert.pem"
    certificate_only.write_text(CA_PEM)
    with pytest.raises(ClientConfigError, match=r"^ssl.keystore.location: .* holds no private key"):
        client_security({"security.protocol": "SSL", "ssl.keystore.location": str(certificate_only)})


@pytest.mark.parametrize(("properties", "key", "says"), [
    ({"security.protocol": "SASL_TLS"}, "security.protocol", "not one of"),
    ({"security.protocol": "SASL_SSL"}, "sasl.mechanism", "GSSAPI"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism", "not supported"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.jaas.config": SCRAM_JAAS},
     "sasl.jaas.config", "does not go with"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
      "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"a\""},
     "sasl.jaas.config", "ending with ';'"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
      "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"a\";"},
     "sasl.jaas.config", "no password"),
    ({"security.protocol": "SSL", "ssl.truststore.type": "BKS", "ssl.truststore.location": "x.bks"},
     "ssl.truststore.type", "one of JKS, PKCS12, PEM"),
    ({"security.protocol": "SSL", "ssl.truststore.location": "/nonexistent/ca.pem"},
     "ssl.truststore.location", "cannot read"),
    ({"security.protocol": "SSL", "ssl.keystore.location": "k.pem", "ssl.keystore.password": "x"},
     "ssl.keystore.password", "PEM"),
    ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "dns"},
     "ssl.endpoint.identification.algorithm", "https"),
    ({"security.protocol": "SSL", "ssl.engine.factory.class": "x"}, "ssl.engine.factory.class", "not a supported"),
])
def test_a_bad_setting_is_refused_naming_its_key(properties: dict[str, str], key: str, says: str) -> None:
    with pytest.raises(ClientConfigError) as refused:
        client_security(properties)
    assert refused.value.key == key and str(refused.value).startswith(f"{key}: ") and says in str(refused.value)


def test_a_truststore_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    jks = tmp_path / "trust.jks"
    jks.write_bytes(b"\xfe\xed\xfe\xed binary")
    with pytest.raises(ClientConfigError, match=r"^ssl.truststore.location: .* is not a readable JKS store"):
        client_security({"security.protocol": "SSL", "ssl.truststore.location": str(jks)})
    pem_typed = tmp_path / "trust.pem"
    pem_typed.write_bytes(b"\xfe\xed\xfe\xed binary")
    with pytest.raises(ClientConfigError, match=r"^ssl.truststore.location: .* not a PEM file"):
        client_security({"security.protocol": "SSL", "ssl.truststore.location": str(pem_typed),
                         "ssl.truststore.type": "PEM"})


def test_secrets_stay_out_of_repr_and_the_log_line() -> None:
    security = client_security({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                                "sasl.jaas.config": SCRAM_JAAS, "client.id": "ignored"})
    assert "s3cr" not in repr(security) and "s3cr" not in security.describe()
    assert "principal=alice" in security.describe()


def test_oauthbearer_unsecured_and_oidc() -> None:
    unsecured = client_security({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
                                 "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer."
                                                     "OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="
                                                     "\"svc\";"})
    assert unsecured.librdkafka_settings()["sasl.oauthbearer.config"] == "principal=svc"
    assert sasl_client.supports(unsecured)
    oidc = client_security({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
                            "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
                            "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
                                                "required clientId=\"svc\" clientSecret=\"top\" scope=\"kafka\";"})
    settings = oidc.librdkafka_settings()
    assert (settings["sasl.oauthbearer.method"], settings["sasl.oauthbearer.client.id"],
            settings["sasl.oauthbearer.scope"]) == ("oidc", "svc", "kafka")
    assert not sasl_client.supports(oidc) and "top" not in repr(oidc)


def test_relative_locations_resolve_beside_the_file(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text(CA_PEM)
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location=ca.pem\n")
    assert load_command_config(config).ca_location == str((tmp_path / "ca.pem").resolve())
    with pytest.raises(ClientConfigError, match="^--command-config: cannot read"):
        load_command_config(tmp_path / "missing.properties")


def test_secured_adds_the_settings_of_that_cluster_only() -> None:
    security = client_security({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                "sasl.username": "u", "sasl.password": "p"})
    forget = use_for_cluster("broker-a:9092", security)
    try:
        assert secured({"bootstrap.servers": "broker-a:9092"})["sasl.username"] == "u"
        assert secured({"bootstrap.servers": "broker-b:9092"}) == {"bootstrap.servers": "broker-b:9092"}
    finally:
        forget()
    assert secured({"bootstrap.servers": "broker-a:9092"}) == {"bootstrap.servers": "broker-a:9092"}


def test_our_tls_context_checks_the_host_name_unless_told_not_to(ca_file: Path) -> None:
    # the CA text above is not a real certificate: build the context from the system store instead
    verified = client_security({"security.protocol": "SSL"}).ssl_context()
    assert verified is not None and verified.check_hostname and verified.verify_mode == ssl.CERT_REQUIRED
    assert verified.minimum_version >= ssl.TLSVersion.TLSv1_2
    unchecked = client_security({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": ""})
    assert not unchecked.ssl_context().check_hostname  # type: ignore[union-attr]


def test_scram_sha_256_follows_rfc_7677() -> None:
    exchange = sasl_client._scram("SCRAM-SHA-256", "user", "pencil", client_nonce="rOprNGfwEbeRWgbNEkqO")
    assert next(exchange) == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = exchange.send(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert final == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    with pytest.raises(StopIteration):
        exchange.send(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")


def test_scram_refuses_a_server_that_does_not_know_the_password() -> None:
    exchange = sasl_client._scram("SCRAM-SHA-256", "user", "pencil", client_nonce="rOprNGfwEbeRWgbNEkqO")
    next(exchange)
    exchange.send(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    with pytest.raises(sasl_client.ClusterAuthenticationError, match="signature does not match"):
        exchange.send(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")


def test_plain_token_is_rfc_4616() -> None:
    assert next(sasl_client._plain("alice", "pw")) == b"\0alice\0pw"
