"""Our listeners' TLS layer (coordinator/security/tls_transport.py) against real TLS clients (Python's ssl over real
sockets, memory-BIO peers that cut the record stream anywhere, OpenSSL's s_client): every byte in order whatever
the cuts, close_notify and EOF given to the protocol after its data, back-pressure both ways, large answers,
unreadable records and a stalled handshake closing the connection, renegotiation refused; on asyncio and uvloop."""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.embedded.certificates import CertificateSet, make_test_certificates
from coordinator.security.listeners import Listener, server_ssl_context
from coordinator.security.tls_transport import TlsServerConnection, accept_tls

_WAIT_S = 10


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> CertificateSet:
    return make_test_certificates(tmp_path_factory.mktemp("tls-transport-certificates"))


def _server_context(certificates: CertificateSet, **settings: str) -> ssl.SSLContext:
    context = server_ssl_context(Listener("SSL", "127.0.0.1", 0), {
        "ssl.keystore.location": str(certificates.broker_keystore), **settings})
    assert context is not None
    return context


def _client_context(certificates: CertificateSet) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certificates.ca))


class Recorder(asyncio.BufferedProtocol):
    """Keeps what it reads; answers each `b"?"+n` line-less command with n bytes when `answering`."""

    def __init__(self, buffer_bytes: int = 1_024) -> None:
        self.buffer = bytearray(buffer_bytes)
        self.received = bytearray()
        self.events: list[str] = []
        self.transport: Any = None
        self.eof = asyncio.Event()
        self.lost = asyncio.Event()
        self.writing_paused = asyncio.Event()
        self.writing_resumed = asyncio.Event()
        self.keep_open_at_eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.events.append("made")

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.received += self.buffer[:nbytes]

    def eof_received(self) -> bool:
        self.events.append("eof")
        self.eof.set()
        return self.keep_open_at_eof

    def pause_writing(self) -> None:
        self.writing_paused.set()

    def resume_writing(self) -> None:
        self.writing_resumed.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")
        self.lost.set()


class Listening:
    """A listening socket whose accepted connections go through accept_tls into Recorders."""

    def __init__(self, context: ssl.SSLContext, *, handshake_timeout_s: float = 60.0) -> None:
        self.context = context
        self.handshake_timeout_s = handshake_timeout_s
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.accepted: asyncio.Queue[Recorder | BaseException] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._accept())
        self.buffer_bytes = 1_024

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self.sock)
            recorder = Recorder(self.buffer_bytes)
            try:
                await accept_tls(loop, lambda: recorder, conn, self.context,
                                 handshake_timeout_s=self.handshake_timeout_s)
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                self.accepted.put_nowait(exc)
            else:
                self.accepted.put_nowait(recorder)

    async def next(self) -> Recorder:
        accepted = await asyncio.wait_for(self.accepted.get(), _WAIT_S)
        assert isinstance(accepted, Recorder), accepted
        return accepted

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.sock.close()


class MemoryPeer:
    """A TLS client over a raw socket with memory BIOs: sends its records cut wherever the test says."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self.loop = asyncio.get_running_loop()
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="localhost")

    @classmethod
    async def connect(cls, port: int, context: ssl.SSLContext) -> MemoryPeer:
        sock = socket.socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        peer = cls(sock, context)
        await peer.handshake()
        return peer

    async def receive(self) -> bool:
        chunk = await asyncio.wait_for(self.loop.sock_recv(self.sock, 65_536), _WAIT_S)
        if chunk:
            self.incoming.write(chunk)
        else:
            self.incoming.write_eof()
        return bool(chunk)

    async def handshake(self) -> None:
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self.loop.sock_sendall(self.sock, self.outgoing.read())
                assert await self.receive(), "closed during the handshake"
        await self.loop.sock_sendall(self.sock, self.outgoing.read())

    def encrypt(self, data: bytes) -> bytes:
        self.tls.write(data)
        return self.outgoing.read()

    async def send_cut(self, ciphertext: bytes, cuts: list[int]) -> None:
        start = 0
        for cut in sorted(set(cuts)) + [len(ciphertext)]:
            if cut > start:
                await self.loop.sock_sendall(self.sock, ciphertext[start:cut])
                await asyncio.sleep(0)  # separate reads on the server, as a slow network gives them
                start = cut

    async def read_until_closed(self) -> bytes:
        data = b""
        while True:
            try:
                data += self.tls.read(65_536)
            except ssl.SSLWantReadError:
                if not await self.receive():
                    return data
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return data

    def close(self) -> None:
        self.sock.close()


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(_WAIT_S):
        while not condition():
            await asyncio.sleep(0.005)


async def _with_listener(context: ssl.SSLContext, body: Callable[[Listening], Awaitable[None]]) -> None:
    listening = Listening(context)
    try:
        await body(listening)
    finally:
        await listening.close()


# ------------------------------------------------------------------------------------------------ tests


async def test_bytes_arrive_in_order_and_answers_reach_a_stream_client(certificates: CertificateSet) -> None:
    async def body(listening: Listening) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", listening.port,
                                                       ssl=_client_context(certificates), server_hostname="localhost")
        server = await listening.next()
        assert server.transport.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        assert server.transport.get_extra_info("peername") == writer.get_extra_info("sockname")
        sent = bytes(range(256)) * 200  # records of 16 KiB, several server reads of a 1 KiB protocol buffer
        writer.write(sent)
        await _until(lambda: len(server.received) == len(sent))
        assert server.received == sent
        answer = bytes(reversed(sent)) * 20  # ~1 MiB: many records, more than the socket takes at once
        server.transport.write(answer)
        assert await asyncio.wait_for(reader.readexactly(len(answer)), _WAIT_S) == answer
        writer.close()
        await asyncio.wait_for(server.lost.wait(), _WAIT_S)
        assert server.events == ["made", "eof", "lost"]

    await _with_listener(_server_context(certificates), body)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(st.binary(min_size=1, max_size=3_000), min_size=1, max_size=6), data=st.data())
def test_records_cut_anywhere_arrive_whole_and_in_order(certificates: CertificateSet, messages: list[bytes],
                                                        data: st.DataObject) -> None:
    async def body(listening: Listening) -> None:
        peer = await MemoryPeer.connect(listening.port, _client_context(certificates))
        server = await listening.next()
        try:
            ciphertext = b"".join(peer.encrypt(message) for message in messages)
            cuts = data.draw(st.lists(st.integers(0, len(ciphertext)), max_size=12))
            await peer.send_cut(ciphertext, cuts)
            expected = b"".join(messages)
            await _until(lambda: len(server.received) >= len(expected))
            assert server.received == expected
        finally:
            peer.close()

    asyncio.run(_with_listener(_server_context(certificates), body))


async def test_close_notify_comes_after_the_data_sent_with_it_and_is_answered(certificates: CertificateSet) -> None:
    async def body(listening: Listening) -> None:
        peer = await MemoryPeer.connect(listening.port, _client_context(certificates))
        server = await listening.next()
        try:
            ciphertext = peer.encrypt(b"last words")
            try:
                peer.tls.unwrap()
            except ssl.SSLWantReadError:
                pass
            await peer.send_cut(ciphertext + peer.outgoing.read(), [3])  # data and close_notify in one stream
            await asyncio.wait_for(server.eof.wait(), _WAIT_S)
            assert server.received == b"last words"
            assert await peer.read_until_closed() == b""
            assert peer.tls.get_channel_binding() is not None
            await asyncio.wait_for(server.lost.wait(), _WAIT_S)
            assert server.events == ["made", "eof", "lost"]
        finally:
            peer.close()

    await _with_listener(_server_context(certificates), body)


async def test_a_tcp_eof_without_close_notify_is_the_protocols_eof(certificates: CertificateSet) -> None:
    async def body(listening: Listening) -> None:
        peer = await MemoryPeer.connect(listening.port, _client_context(certificates))
        server = await listening.next()
        await peer.loop.sock_sendall(peer.sock, peer.encrypt(b"abc"))
        peer.sock.shutdown(socket.SHUT_WR)
        await asyncio.wait_for(server.lost.wait(), _WAIT_S)
        peer.close()
        assert server.received == b"abc" and server.events == ["made", "eof", "lost"]

    await _with_listener(_server_context(certificates), body)


async def test_records_held_while_reading_is_paused_come_after_resume(certificates: CertificateSet) -> None:
    async def body(listening: Listening) -> None:
        peer = await MemoryPeer.connect(listening.port, _client_context(certificates))
        server = await listening.next()
        try:
            server.transport.pause_reading()
            assert not server.transport.is_reading()
            await peer.loop.sock_sendall(peer.sock, peer.encrypt(b"one") + peer.encrypt(b"two"))
            await asyncio.sleep(0.05)
            assert server.received == b""
            server.transport.resume_reading()
            await _until(lambda: server.received == b"onetwo")
        finally:
            peer.close()

    await _with_listener(_server_context(certificates), body)


async def test_a_client_that_does_not_read_pauses_our_writing_until_it_reads(certificates: CertificateSet) -> None:
    async def body(listening: Listening) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", listening.port, limit=1 << 20,
                                                       ssl=_client_context(certificates), server_hostname="localhost")
        server = await listening.next()
        chunk = b"x" * 65_536
        writer.transport.pause_reading()
        written = 0
        while not server.writing_paused.is_set():
            server.transport.write(chunk)
            written += len(chunk)
            assert written < 64 << 20, "the TCP transport never asked us to pause"
            await asyncio.sleep(0)
        assert server.transport.get_write_buffer_size() > 0
        writer.transport.resume_reading()
        assert len(await asyncio.wait_for(reader.readexactly(written), _WAIT_S)) == written
        await asyncio.wait_for(server.writing_resumed.wait(), _WAIT_S)
        writer.close()

    await _with_listener(_server_context(certificates), body)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(min_size=1, max_size=400), data=st.data())
def test_unreadable_records_close_the_connection_with_a_log_line(certificates: CertificateSet, garbage: bytes,
                                                                 data: st.DataObject) -> None:
    async def body(listening: Listening) -> None:
        peer = await MemoryPeer.connect(listening.port, _client_context(certificates))
        server = await listening.next()
        try:
            record = bytearray(peer.encrypt(b"hello"))
            kind = data.draw(st.sampled_from(["garbage", "flipped", "header"]))
            if kind == "garbage":
                hostile = bytes([23, 3, 3]) + len(garbage).to_bytes(2, "big") + garbage  # a record of noise
            elif kind == "flipped":
                at = data.draw(st.integers(5, len(record) - 1))
                record[at] ^= data.draw(st.integers(1, 255))
                hostile = bytes(record)
            else:
                hostile = bytes([data.draw(st.integers(0, 255)), 0xFF, 0xFF, 0xFF, 0xFF]) + garbage
            await peer.loop.sock_sendall(peer.sock, hostile)
            await asyncio.wait_for(server.lost.wait(), _WAIT_S)
            assert server.received == b""
        finally:
            peer.close()

    asyncio.run(_with_listener(_server_context(certificates), body))


async def test_bytes_that_are_not_tls_fail_the_handshake(certificates: CertificateSet) -> None:
    async def body(listening: Listening) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", listening.port)
        writer.write(b"\x00\x00\x00\x10" + b"\x00" * 16)  # a Kafka frame on a TLS port
        assert isinstance(await asyncio.wait_for(listening.accepted.get(), _WAIT_S), ssl.SSLError)
        await asyncio.wait_for(reader.read(), _WAIT_S)  # closed (after OpenSSL's alert)
        writer.close()

    await _with_listener(_server_context(certificates), body)


async def test_a_stalled_handshake_times_out_and_closes(certificates: CertificateSet) -> None:
    listening = Listening(_server_context(certificates), handshake_timeout_s=0.2)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listening.port)  # TCP only, no ClientHello
        assert isinstance(await asyncio.wait_for(listening.accepted.get(), _WAIT_S), TimeoutError)
        assert await asyncio.wait_for(reader.read(), _WAIT_S) == b""
        writer.close()
    finally:
        await listening.close()


async def test_required_client_certificates_are_checked_before_the_protocol_exists(
        certificates: CertificateSet) -> None:
    context = _server_context(certificates, **{"ssl.client.auth": "required",
                                               "ssl.truststore.location": str(certificates.ca)})

    async def body(listening: Listening) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", listening.port,
                                                       ssl=_client_context(certificates), server_hostname="localhost")
        refused = await asyncio.wait_for(listening.accepted.get(), _WAIT_S)
        assert isinstance(refused, ssl.SSLError)
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(1), _WAIT_S)
        writer.close()

    await _with_listener(context, body)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs OpenSSL's s_client")
async def test_a_client_asking_to_renegotiate_is_refused(certificates: CertificateSet) -> None:
    """TLS 1.2 renegotiation asked by `openssl s_client` ("R"): refused with OpenSSL's no_renegotiation alert, no
    second handshake; s_client gives up on the connection, and what it sent before had arrived."""
    async def body(listening: Listening) -> None:
        client = await asyncio.create_subprocess_exec(
            "openssl", "s_client", "-connect", f"127.0.0.1:{listening.port}", "-tls1_2", "-CAfile",
            str(certificates.ca), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert client.stdin is not None
            server = await listening.next()
            client.stdin.write(b"before\n")
            await _until(lambda: server.received == b"before\n")
            client.stdin.write(b"R\n")
            _out, err = await asyncio.wait_for(client.communicate(), _WAIT_S)
            assert b"no renegotiation" in err.lower(), err
            await asyncio.wait_for(server.lost.wait(), _WAIT_S)
            assert server.received == b"before\n"
        finally:
            if client.returncode is None:
                client.kill()
                await asyncio.wait_for(client.wait(), _WAIT_S)

    await _with_listener(_server_context(certificates), body)


async def test_the_protocol_is_not_made_for_a_peer_gone_during_the_handshake(certificates: CertificateSet) -> None:
    loop = asyncio.get_running_loop()
    made: list[Recorder] = []
    listening_sock = socket.create_server(("127.0.0.1", 0))
    listening_sock.setblocking(False)
    try:
        client = socket.create_connection(listening_sock.getsockname())
        conn, _ = await loop.sock_accept(listening_sock)
        client.close()
        with pytest.raises((ConnectionError, ssl.SSLError)):
            await asyncio.wait_for(accept_tls(loop, lambda: made.append(Recorder()) or made[-1], conn,
                                              _server_context(certificates)), _WAIT_S)
        assert made == []
    finally:
        listening_sock.close()


def test_each_thread_reads_into_one_buffer_for_all_its_connections(certificates: CertificateSet) -> None:
    async def two() -> tuple[TlsServerConnection, TlsServerConnection]:
        context = _server_context(certificates)
        return TlsServerConnection(context, Recorder), TlsServerConnection(context, Recorder)

    first, second = asyncio.run(two())
    assert first.get_buffer(-1) is second.get_buffer(-1)


@pytest.mark.parametrize("test", [test_bytes_arrive_in_order_and_answers_reach_a_stream_client,
                                  test_close_notify_comes_after_the_data_sent_with_it_and_is_answered,
                                  test_a_tcp_eof_without_close_notify_is_the_protocols_eof,
                                  test_records_held_while_reading_is_paused_come_after_resume,
                                  test_a_client_that_does_not_read_pauses_our_writing_until_it_reads,
                                  test_bytes_that_are_not_tls_fail_the_handshake],
                         ids=lambda test: test.__name__.removeprefix("test_"))
def test_on_uvloop(certificates: CertificateSet, test: Callable[[CertificateSet], Awaitable[None]]) -> None:
    uvloop.run(test(certificates))


def test_hostile_records_log_one_line(certificates: CertificateSet, caplog: pytest.LogCaptureFixture) -> None:
    async def body(listening: Listening) -> None:
        peer = await MemoryPeer.connect(listening.port, _client_context(certificates))
        server = await listening.next()
        record = bytearray(peer.encrypt(b"hello"))
        record[-1] ^= 1
        await peer.loop.sock_sendall(peer.sock, bytes(record))
        await asyncio.wait_for(server.lost.wait(), _WAIT_S)
        peer.close()

    with caplog.at_level(logging.WARNING, logger="coordinator.security"):
        asyncio.run(_with_listener(_server_context(certificates), body))
    lines = [r.getMessage() for r in caplog.records if "tls_record_unreadable" in r.getMessage()]
    assert len(lines) == 1 and "reason=tls_record_unreadable" in lines[0]
