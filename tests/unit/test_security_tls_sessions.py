"""TLS session resumption on the connections we open to brokers: real TLS 1.3 handshakes on loopback against a
server with one TLS context, and against one that hands connections in turn to three contexts of their own (as
Kafka's network threads do, each with its own ticket keys)."""

from __future__ import annotations

import asyncio
import itertools
import ssl
from pathlib import Path
from types import SimpleNamespace

import pytest

from coordinator.embedded.certificates import CertificateSet, make_test_certificates
from coordinator.relay.buffer_pool import BufferPool
from coordinator.relay.upstream import RelayCounters
from coordinator.security.client_config import client_security
from coordinator.security.clusters import ClusterSecurity
from coordinator.security.connections import connect
from coordinator.security.listeners import Listener, server_ssl_context
from tests.support.polling import wait_until


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> CertificateSet:
    return make_test_certificates(tmp_path_factory.mktemp("sessions"), hosts=("127.0.0.1",))


class TlsServer:
    """Accepts TCP, then runs TLS with its contexts in turn; records whether each handshake resumed a session."""

    def __init__(self, contexts: list[ssl.SSLContext]) -> None:
        self.use(contexts)
        self.resumed: list[bool] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    def use(self, contexts: list[ssl.SSLContext]) -> None:
        """From the next connection on, these contexts in turn (new ones: new ticket keys, as after a restart)."""
        self._contexts = itertools.cycle(contexts)

    async def __aenter__(self) -> TlsServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await writer.start_tls(next(self._contexts))
        self.resumed.append(writer.get_extra_info("ssl_object").session_reused)
        await reader.read()  # until the client closes
        writer.close()


def server_contexts(certificates: CertificateSet, count: int) -> list[ssl.SSLContext]:
    """`count` TLS contexts of one certificate: each with ticket keys of its own."""
    contexts = [server_ssl_context(Listener("SSL", "127.0.0.1", 0),
                                   {"ssl.keystore.location": str(certificates.broker_keystore)})
                for _ in range(count)]
    return [context for context in contexts if context is not None]


def cluster_security(ca: Path) -> ClusterSecurity:
    client = client_security({"security.protocol": "SSL", "ssl.truststore.location": str(ca)})
    return ClusterSecurity.of(client)


async def connect_and_close(server: TlsServer, security: ClusterSecurity) -> None:
    """One connection, kept until the server's session ticket has reached the client."""
    client = await connect("127.0.0.1", server.port, security, client_id="t", timeout_ms=10_000, negotiate=False)
    transport = client.detach()
    try:
        ssl_object = transport.get_extra_info("ssl_object")
        await wait_until(lambda: ssl_object.session is not None and ssl_object.session.has_ticket, timeout_s=10,
                         what="the server's session ticket")
    finally:
        transport.close()


async def test_later_connections_to_a_broker_resume_the_session_of_an_earlier_one(
        certificates: CertificateSet) -> None:
    security = cluster_security(certificates.ca)
    async with TlsServer(server_contexts(certificates, 1)) as server:
        for _ in range(5):
            await connect_and_close(server, security)
        await wait_until(lambda: len(server.resumed) == 5, timeout_s=10,
                         what="the server's handshakes")
    assert server.resumed == [False, True, True, True, True]


async def test_a_broker_with_a_context_per_network_thread_resumes_once_the_lag_is_learnt(
        certificates: CertificateSet) -> None:
    security = cluster_security(certificates.ca)
    async with TlsServer(server_contexts(certificates, 3)) as server:
        for _ in range(14):
            await connect_and_close(server, security)
        await wait_until(lambda: len(server.resumed) == 14, timeout_s=10,
                         what="the server's handshakes")
    # a ticket offered to another context's thread is turned down: lag 1, 2, then 3, which every later one hits
    assert server.resumed[-6:] == [True] * 6, server.resumed
    sessions = security.tls_sessions
    assert sessions is not None and (sessions.handshakes, sessions.resumed) == (14, sum(server.resumed))


async def test_a_session_turned_down_is_not_offered_again(certificates: CertificateSet) -> None:
    """The broker restarted (new ticket keys): the session offered is turned down once, and the next connection
    offers the session of the one that was turned down, which the broker issued."""
    security = cluster_security(certificates.ca)
    async with TlsServer(server_contexts(certificates, 1)) as server:
        for _ in range(3):
            await connect_and_close(server, security)
        server.use(server_contexts(certificates, 1))
        for _ in range(3):
            await connect_and_close(server, security)
        await wait_until(lambda: len(server.resumed) == 6, timeout_s=10, what="the server's handshakes")
    assert server.resumed == [False, True, True, False, True, True]


async def test_no_session_is_offered_without_a_cache(certificates: CertificateSet) -> None:
    security = ClusterSecurity(cluster_security(certificates.ca).client, cluster_security(certificates.ca).ssl_context,
                               {}, tls_sessions=None)
    async with TlsServer(server_contexts(certificates, 1)) as server:
        for _ in range(3):
            await connect_and_close(server, security)
        await wait_until(lambda: len(server.resumed) == 3, timeout_s=10,
                         what="the server's handshakes")
    assert server.resumed == [False, False, False]


async def test_a_session_is_kept_per_broker_address(certificates: CertificateSet) -> None:
    """A ticket from one broker is never offered to another (it could not resume there, and a lag learnt on one
    says nothing about the other)."""
    security = cluster_security(certificates.ca)
    shared = server_contexts(certificates, 1)  # either server would resume the other's sessions
    async with TlsServer(shared) as first, TlsServer(shared) as second:
        await connect_and_close(first, security)
        await connect_and_close(second, security)
        await connect_and_close(first, security)
        await wait_until(lambda: len(first.resumed) == 2 and len(second.resumed) == 1, timeout_s=10,
                         what="the server's handshakes")
    assert first.resumed == [False, True] and second.resumed == [False]


async def test_the_relays_handshakes_are_exported_new_and_resumed(certificates: CertificateSet) -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from coordinator.telemetry.metrics import MetricsObserver
    from coordinator.telemetry.otel import start_telemetry

    security = cluster_security(certificates.ca)
    async with TlsServer(server_contexts(certificates, 1)) as server:
        for _ in range(3):
            await connect_and_close(server, security)
    relay = SimpleNamespace(counters=RelayCounters(), pool=BufferPool(1 << 20, 16_384, 1_000), link_security=security)
    reader = InMemoryMetricReader()
    telemetry = start_telemetry(env={}, metric_readers=[reader])
    try:
        MetricsObserver(telemetry.meter_provider.get_meter("test")).watch_relay(relay)
        data = reader.get_metrics_data()
    finally:
        telemetry.shutdown()
    [handshakes] = [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                    if m.name == "coordinator.relay.tls.handshakes"]
    assert {p.attributes["session"]: p.value for p in handshakes.data.data_points} == {"new": 1, "resumed": 2}
