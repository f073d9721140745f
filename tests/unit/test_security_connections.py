"""The connections the relay opens itself: TLS checks the broker's certificate against the host it was told (the
broker's advertised host), over a real TLS handshake on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from coordinator.embedded.certificates import CertificateSet, make_test_certificates
from coordinator.security.client_config import client_security
from coordinator.security.clusters import ClusterSecurity
from coordinator.security.connections import ClusterAccessError, connect
from coordinator.security.listeners import Listener, server_ssl_context


@pytest.fixture(scope="module")
def named_broker_example(tmp_path_factory: pytest.TempPathFactory) -> CertificateSet:
    """A server certificate naming broker.example only (not 127.0.0.1, where it will listen)."""
    return make_test_certificates(tmp_path_factory.mktemp("hostname"), hosts=("broker.example",))


@pytest.fixture
async def tls_server(named_broker_example: CertificateSet) -> AsyncIterator[int]:
    context = server_ssl_context(Listener("SSL", "127.0.0.1", 0),
                                 {"ssl.keystore.location": str(named_broker_example.broker_keystore)})
    server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def security(ca: Path, verify_hostname: bool = True) -> ClusterSecurity:
    client = client_security({"security.protocol": "SSL", "ssl.truststore.location": str(ca),
                              "ssl.endpoint.identification.algorithm": "https" if verify_hostname else ""})
    return ClusterSecurity(client, client.ssl_context(), client.librdkafka_settings())


async def test_a_certificate_not_naming_the_host_is_refused(tls_server: int,
                                                             named_broker_example: CertificateSet) -> None:
    with pytest.raises(ClusterAccessError, match="certificate was not accepted .*mismatch, certificate is not valid for '127.0.0.1'"):
        await connect("127.0.0.1", tls_server, security(named_broker_example.ca), client_id="t", timeout_ms=10_000,
                      negotiate=False)


async def test_the_same_certificate_passes_with_host_name_verification_off(
        tls_server: int, named_broker_example: CertificateSet) -> None:
    client = await connect("127.0.0.1", tls_server, security(named_broker_example.ca, verify_hostname=False),
                           client_id="t", timeout_ms=10_000, negotiate=False)
    await client.close()


async def test_a_certificate_from_another_ca_is_refused(tls_server: int, tmp_path: Path) -> None:
    other = make_test_certificates(tmp_path, hosts=("127.0.0.1",))
    with pytest.raises(ClusterAccessError, match="certificate was not accepted"):
        await connect("127.0.0.1", tls_server, security(other.ca, verify_hostname=False), client_id="t",
                      timeout_ms=10_000, negotiate=False)
