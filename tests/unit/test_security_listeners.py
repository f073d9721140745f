"""Our listeners in Kafka's terms: the listener syntax of --listen and the broker's ssl.* names, with errors naming
the setting; ssl.client.auth's three modes."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from coordinator.embedded.certificates import make_test_certificates
from coordinator.security.client_config import ClientConfigError
from coordinator.security.listeners import Listener, parse_listener, server_ssl_context, split_listener_settings


@pytest.mark.parametrize(("text", "listener"), [
    ("127.0.0.1:9192", Listener("PLAINTEXT", "127.0.0.1", 9192)),
    ("PLAINTEXT://0.0.0.0:9092", Listener("PLAINTEXT", "0.0.0.0", 9092)),
    ("ssl://broker.example:9093", Listener("SSL", "broker.example", 9093)),
    ("SSL://[::1]:0", Listener("SSL", "::1", 0)),
    ("SASL_SSL://h:1", Listener("SASL_SSL", "h", 1)),
])
def test_kafka_listener_syntax(text: str, listener: Listener) -> None:
    assert parse_listener(text) == listener


@pytest.mark.parametrize(("text", "says"), [
    ("TLS://h:1", "not a security protocol"), ("h", "expected"),
    ("h:99999", "not a port"),
])
def test_a_bad_listener_says_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_listener(text)


def test_ssl_names_are_split_from_the_coordinators_own() -> None:
    tls, rest = split_listener_settings({"ssl.client.auth": "required", "group.max.size": "10"})
    assert tls == {"ssl.client.auth": "required"} and rest == {"group.max.size": "10"}


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return make_test_certificates(tmp_path_factory.mktemp("listener-certificates"))


@pytest.mark.parametrize(("client_auth", "mode"), [
    ("none", ssl.CERT_NONE), ("requested", ssl.CERT_OPTIONAL), ("required", ssl.CERT_REQUIRED)])
def test_client_auth_modes(certificates, client_auth: str, mode: ssl.VerifyMode) -> None:  # type: ignore[no-untyped-def]
    context = server_ssl_context(Listener("SSL", "127.0.0.1", 0), {
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(certificates.broker_keystore),
        "ssl.truststore.location": str(certificates.ca), "ssl.client.auth": client_auth})
    assert context is not None and context.verify_mode == mode
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_plaintext_has_no_tls() -> None:
    assert server_ssl_context(Listener("PLAINTEXT", "127.0.0.1", 0), {"ssl.client.auth": "required"}) is None


@pytest.mark.parametrize(("settings", "key"), [
    ({}, "ssl.keystore.location"),
    ({"ssl.keystore.type": "BKS"}, "ssl.keystore.type"),
    ({"ssl.client.auth": "required"}, "ssl.truststore.location"),
    ({"ssl.client.auth": "always"}, "ssl.client.auth"),
    ({"ssl.enabled.protocols": "TLSv1.1"}, "ssl.enabled.protocols"),
    ({"ssl.keystore.password": "x"}, "ssl.keystore.password"),
])
def test_a_bad_listener_setting_names_its_key(certificates, settings: dict[str, str], key: str) -> None:  # type: ignore[no-untyped-def]
    base = {} if key in ("ssl.keystore.location", "ssl.keystore.type") else {
        "ssl.keystore.location": str(certificates.broker_keystore)}
    with pytest.raises(ClientConfigError) as refused:
        server_ssl_context(Listener("SSL", "127.0.0.1", 0), {**base, **settings})
    assert refused.value.key == key


def test_a_keystore_without_its_key_is_refused(certificates, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    chain_only = tmp_path / "chain.pem"
    chain_only.write_text(certificates.ca.read_text())
    with pytest.raises(ClientConfigError, match="^ssl.keystore.location: .* private key"):
        server_ssl_context(Listener("SSL", "127.0.0.1", 0), {"ssl.keystore.location": str(chain_only)})
