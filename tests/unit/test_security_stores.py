"""JKS and PKCS12 stores (Java's keytool and openssl made them) on our listeners and in --command-config, as Kafka
takes them: the type (JKS by default, whose reader takes PKCS12 too), the store and key passwords; a TLS handshake
between our listener's context and a client's proves the key and chain; the refusals name the setting."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

import pytest

from coordinator.embedded.certificates import CertificateSet, make_test_certificates
from coordinator.security.client_config import ClientConfigError, client_security
from coordinator.security.listeners import Listener, server_ssl_context
from coordinator.security.stores import pem_files, read_keystore, read_truststore
from tests.support.java_stores import PASSWORD, JavaStores, make_java_stores

LISTENER = Listener("SSL", "127.0.0.1", 0)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[CertificateSet, JavaStores]:
    directory = tmp_path_factory.mktemp("stores")
    certificates = make_test_certificates(directory / "certificates", clients=("coordinator",))
    return certificates, make_java_stores(certificates, directory / "java")


async def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> tuple[str, dict[str, object] | None]:
    """TLS over loopback: (the server certificate's subject CN the client verified, the client certificate the
    server saw)."""
    seen: list[dict[str, object] | None] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(writer.get_extra_info("peercert"))
        writer.close()

    listening = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server)
    try:
        port = listening.sockets[0].getsockname()[1]
        _reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="localhost"), 10)
        subject = dict(pair[0] for pair in writer.get_extra_info("peercert")["subject"])
        writer.close()
        await asyncio.wait_for(_wait_for(lambda: bool(seen)), 10)
        return str(subject["commonName"]), seen[0]
    finally:
        listening.close()


async def _wait_for(condition: object) -> None:
    while not condition():  # type: ignore[operator]
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("keystore, kind", [("keystore_jks", "JKS"), ("keystore_p12", "PKCS12"),
                                            ("keystore_p12", None)])  # Kafka's default JKS reads PKCS12 too
async def test_our_listener_serves_with_a_java_keystore_and_requires_certificates_from_a_java_truststore(
        made: tuple[CertificateSet, JavaStores], keystore: str, kind: str | None) -> None:
    certificates, stores = made
    settings = {"ssl.keystore.location": str(getattr(stores, keystore)), "ssl.keystore.password": PASSWORD,
                "ssl.truststore.location": str(stores.truststore_p12), "ssl.truststore.type": "PKCS12",
                "ssl.truststore.password": PASSWORD, "ssl.client.auth": "required"}
    if kind is not None:
        settings["ssl.keystore.type"] = kind
    server = server_ssl_context(LISTENER, settings)
    assert server is not None
    client = ssl.create_default_context(cafile=str(certificates.ca))
    client_keystore = str(certificates.client_keystore("coordinator"))
    client.load_cert_chain(client_keystore, client_keystore)
    common_name, peer = await handshake(server, client)
    assert common_name == "localhost" and peer is not None  # the broker certificate, our client's seen


async def test_command_config_with_pkcs12_keystore_and_jks_truststore(made: tuple[CertificateSet, JavaStores],
                                                                      tmp_path: Path) -> None:
    certificates, stores = made
    security = client_security({"security.protocol": "SSL", "ssl.keystore.type": "PKCS12",
                                "ssl.keystore.location": str(stores.client_keystore_p12),
                                "ssl.keystore.password": PASSWORD, "ssl.key.password": PASSWORD,
                                "ssl.truststore.type": "JKS", "ssl.truststore.location": str(stores.truststore_jks),
                                "ssl.truststore.password": PASSWORD})
    assert security.key_material is not None and "client.p12 (PKCS12)" in security.describe()
    librdkafka = security.librdkafka_settings()
    assert "BEGIN CERTIFICATE" in librdkafka["ssl.ca.pem"] and "BEGIN PRIVATE KEY" in librdkafka["ssl.key.pem"]
    assert "BEGIN CERTIFICATE" in librdkafka["ssl.certificate.pem"]
    assert PASSWORD not in security.describe() and PASSWORD not in repr(security)
    # the relay's own connections: mTLS to a server that requires the client certificate
    server = server_ssl_context(LISTENER, {"ssl.keystore.location": str(certificates.broker_keystore),
                                           "ssl.keystore.type": "PEM", "ssl.truststore.location": str(certificates.ca),
                                           "ssl.client.auth": "required"})
    context = security.ssl_context()
    assert server is not None and context is not None
    _common_name, peer = await handshake(server, context)
    assert peer is not None and ((("commonName", "coordinator"),) in peer["subject"])  # type: ignore[operator]
    with pem_files(security.key_material) as path:  # how the key reaches Python's ssl: a private file, then gone
        assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))


def test_truststores_and_what_is_refused_naming_the_setting(made: tuple[CertificateSet, JavaStores]) -> None:
    certificates, stores = made
    ca = certificates.ca.read_text()
    for path, kind in ((stores.truststore_jks, "JKS"), (stores.truststore_p12, "PKCS12"),
                       (stores.truststore_p12, "JKS")):
        assert read_truststore(path, kind, PASSWORD).strip() == ca.strip()
    assert read_truststore(stores.truststore_jks, "JKS", None).strip() == ca.strip()  # Java: no integrity check
    jks, p12 = str(stores.keystore_jks), str(stores.keystore_p12)
    refusals = [
        ({"ssl.keystore.location": jks, "ssl.keystore.type": "JKS"}, "ssl.keystore.password: needed"),
        ({"ssl.keystore.location": jks, "ssl.keystore.password": "wrong"}, "ssl.keystore.password: cannot read"),
        ({"ssl.keystore.location": jks, "ssl.keystore.type": "PKCS12", "ssl.keystore.password": PASSWORD},
         "ssl.keystore.type: PKCS12, but"),
        ({"ssl.keystore.location": p12, "ssl.keystore.type": "PKCS12", "ssl.keystore.password": "wrong"},
         "ssl.keystore.password: cannot read"),
        ({"ssl.keystore.location": p12, "ssl.keystore.type": "BKS"}, "ssl.keystore.type: BKS: one of"),
        ({"ssl.truststore.location": str(stores.truststore_p12), "ssl.truststore.type": "PKCS12"},
         "ssl.truststore.password: cannot read"),
    ]
    for settings, message in refusals:
        with pytest.raises(ClientConfigError, match=message):
            client_security({"security.protocol": "SSL", **settings})
    key = read_keystore(stores.keystore_jks, "JKS", PASSWORD, None)
    assert key.chain_pem.strip().endswith(ca.strip())  # the chain as imported: leaf, then the CA
