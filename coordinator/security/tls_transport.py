"""TLS on our listeners' connections: a TLS layer of ours between the loop's TCP transport and the connection's
protocol, in place of the loop's own (asyncio's or uvloop's SSLProtocol).

Why our own: a heartbeat is one small TLS record each way, so the per-record bookkeeping around OpenSSL counts as
much as the cryptography. The loop's layer reads every record until `SSLObject.read` raises SSLWantReadError (an
exception object built per heartbeat), queues each write in a backlog before encrypting it and reads the memory
BIO once more after every read; its per-connection read buffer is 256 KiB. Here:
  - a read of the TCP transport lands in one buffer shared by every connection of the thread and is fed to the
    incoming memory BIO at once (one copy), then decrypted straight into the protocol's own buffer
    (BufferedProtocol); records are read while the BIO or OpenSSL still hold bytes, so the common case (one whole
    record) ends without the exception;
  - a write is encrypted at once (`SSLObject.write`, one record per 16 KiB) and the BIO's bytes go to the TCP
    transport in one write, which sends at once when the socket takes it: no backlog of ours, back-pressure is the
    TCP transport's (its pause_writing/resume_writing are passed on);
  - the protocol is made after the handshake, as the loop's layer makes it (a client without a valid certificate
    under ssl.client.auth=required never reaches it).
Kafka's semantics and TLS's stay: a close_notify or an EOF is the protocol's eof_received (the frames it holds are
answered, then our close_notify and the close); renegotiation is refused (OP_NO_RENEGOTIATION on the listener's
context: OpenSSL answers a warning alert); unreadable records close the connection with one log line.

`COORDINATOR_TLS_TRANSPORT=loop` gives TLS back to the event loop's own layer (the bench compares both).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

from protocol.transports import release_transport_cycle

log = logging.getLogger("coordinator.security")

HANDSHAKE_TIMEOUT_S = 60.0  # the loop's own default (ssl_handshake_timeout)
_READ_BUFFER_BYTES = 256 * 1024  # one TCP read at most: as the loop's layer reads
_ENVIRONMENT = "COORDINATOR_TLS_TRANSPORT"
_buffers = threading.local()  # each thread's read buffer (one event loop per thread)


def loops_own_tls() -> bool:
    """Whether the event loop's TLS layer is asked for instead of ours (an operator's way back)."""
    return os.environ.get(_ENVIRONMENT, "").strip().lower() == "loop"


async def accept_tls(loop: asyncio.AbstractEventLoop, protocol_factory: Callable[[], asyncio.BaseProtocol],
                     sock: socket.socket, context: ssl.SSLContext, *,
                     handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S) -> asyncio.BaseTransport:
    """An accepted socket's TLS connection, its protocol made once the handshake is done (as
    `loop.connect_accepted_socket(..., ssl=context)` would make it). A failed or timed-out handshake raises;
    cancelled, the connection is aborted."""
    if loops_own_tls():
        transport, _protocol = await loop.connect_accepted_socket(protocol_factory, sock, ssl=context,
                                                                  ssl_handshake_timeout=handshake_timeout_s)
        return transport
    _tcp, layer = await loop.connect_accepted_socket(
        lambda: TlsServerConnection(context, protocol_factory, handshake_timeout_s), sock)
    try:
        await layer.handshake_done
    except asyncio.CancelledError:
        layer.abort()
        raise
    return layer


def _read_buffer() -> memoryview:
    view = getattr(_buffers, "view", None)
    if view is None:
        view = _buffers.view = memoryview(bytearray(_READ_BUFFER_BYTES))
    return view


class TlsServerConnection(asyncio.BufferedProtocol, asyncio.Transport):
    """The server side of one TLS connection: the TCP transport's protocol below, the connection protocol's
    transport above. Used on its event loop only."""

    def __init__(self, context: ssl.SSLContext, protocol_factory: Callable[[], asyncio.BaseProtocol],
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        super().__init__()
        self._context = context
        self._protocol_factory = protocol_factory
        self._handshake_timeout_s = handshake_timeout_s
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        # the C object's methods, bound once: SSLObject's Python wrappers add a frame to every call
        self._decrypt = self._tls._sslobj.read  # type: ignore[attr-defined]
        self._encrypt = self._tls._sslobj.write  # type: ignore[attr-defined]
        self._decrypted_pending = self._tls._sslobj.pending  # type: ignore[attr-defined]
        self._cipher_view = _read_buffer()
        self._tcp: asyncio.Transport | None = None
        self._app: Any = None  # the connection's protocol, once the handshake is done
        self._app_buffered = False
        self._open = False  # handshake done, not closed by us
        self._lost = False
        self._app_paused = False  # the protocol paused reading: records stay in the BIO
        self._ended = False  # the peer's close_notify (or TCP's EOF) read: given to the protocol after its records
        self._eof_given = False
        self._reading_scheduled = False
        self._tcp_full = False  # the TCP transport asked us to pause writing
        self._handshake_timer: asyncio.TimerHandle | None = None
        self.handshake_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # ------------------------------------------------------------------------------------------ TCP side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._tcp = transport  # type: ignore[assignment]
        self._handshake_timer = asyncio.get_running_loop().call_later(self._handshake_timeout_s,
                                                                      self._handshake_timed_out)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._cipher_view

    def buffer_updated(self, nbytes: int) -> None:
        incoming = self._incoming
        incoming.write(self._cipher_view[:nbytes])
        app = self._app
        if app is None:
            self._handshake()
            return
        if self._app_buffered and self._open and not self._app_paused and not self._ended:
            # the usual read: one whole record, decrypted into the protocol's buffer with no frame of ours between
            buffer = app.get_buffer(-1)
            try:
                count = self._decrypt(len(buffer), buffer)
            except (ssl.SSLError, OSError) as exc:
                count = self._read_failed(exc)
            if count > 0:
                app.buffer_updated(count)
                if not (incoming.pending or self._decrypted_pending() or self._outgoing.pending):
                    return
            elif count == 0:
                self._ended = True
            else:
                if self._outgoing.pending:
                    self._send_outgoing()
                return
        self._read_records()

    def eof_received(self) -> bool:
        if self._app is None:  # the peer left during the handshake
            self._fail_handshake(ConnectionResetError("EOF during the TLS handshake"))
            return False
        self._incoming.write_eof()  # what the BIO holds is still read, then SSL_read reports the end
        self._read_records()
        return True  # we close once the protocol has had its EOF (maybe later: it paused reading)

    def pause_writing(self) -> None:
        self._tcp_full = True
        if self._app is not None:
            self._app.pause_writing()

    def resume_writing(self) -> None:
        self._tcp_full = False
        if self._app is not None:
            self._app.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._open = False
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if self._tcp is not None:
            release_transport_cycle(self._tcp)
        if self._app is None:
            self._fail_handshake(exc or ConnectionResetError("connection lost during the TLS handshake"))
            return
        app, self._app = self._app, None
        app.connection_lost(exc)

    # ------------------------------------------------------------------------------------------ handshake

    def _handshake(self) -> None:
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._send_outgoing()
            return
        except (ssl.SSLError, OSError) as exc:
            self._send_outgoing()  # OpenSSL's alert, so the client learns why
            self._fail_handshake(exc)
            return
        self._send_outgoing()
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self._open = True
        app = self._app = self._protocol_factory()
        self._app_buffered = isinstance(app, asyncio.BufferedProtocol)
        app.connection_made(self)
        if self._tcp_full:
            app.pause_writing()
        if not self.handshake_done.done():
            self.handshake_done.set_result(None)
        if self._incoming.pending and self._app is not None:  # a request sent with the client's Finished
            self._read_records()

    def _handshake_timed_out(self) -> None:
        self._handshake_timer = None
        if self._app is None:
            self._fail_handshake(TimeoutError(f"TLS handshake not done in {self._handshake_timeout_s:g} s"))

    def _fail_handshake(self, exc: BaseException) -> None:
        if self._tcp is not None and not self._tcp.is_closing():
            self._tcp.close()  # after the alert, if any
        if not self.handshake_done.done():
            self.handshake_done.set_exception(exc)
            self.handshake_done.exception()  # retrieved: the acceptor may be gone, no "never retrieved" warning

    # ------------------------------------------------------------------------------------------ records in

    def _read_records(self) -> None:
        """Every whole record the BIO holds, decrypted into the protocol's buffer (one buffer_updated per buffer
        filled), while the protocol reads; the end of the stream (close_notify, or TCP's EOF) once they are read."""
        app = self._app
        incoming = self._incoming
        while app is not None and self._open and not self._app_paused and self._app is app and not self._ended:
            if self._app_buffered:
                buffer = app.get_buffer(-1)
                count = self._decrypt_into(buffer)
                if count > 0:
                    app.buffer_updated(count)
            else:
                data = self._decrypt_bytes()
                count = len(data)
                if count > 0:
                    app.data_received(data)
            if count <= 0 or not (incoming.pending or self._decrypted_pending() or incoming.eof):
                break
        if self._outgoing.pending:  # OpenSSL's own answers (a refused renegotiation's alert, a KeyUpdate)
            self._send_outgoing()
        if self._ended and not self._eof_given and self._open and self._app is app and app is not None \
                and not self._app_paused:
            self._eof_given = True
            if not app.eof_received() and self._open:
                self.close()

    def _decrypt_into(self, buffer: Any) -> int:
        """Bytes decrypted into `buffer`: every whole record that fits (usually one)."""
        size = len(buffer)
        count = self._decrypt_once(size, buffer)
        if count <= 0 or count >= size or not (self._incoming.pending or self._decrypted_pending()):
            return max(count, 0)
        view = memoryview(buffer)
        offset = count
        while offset < size and (self._incoming.pending or self._decrypted_pending()):
            count = self._decrypt_once(size - offset, view[offset:])
            if count <= 0:
                break
            offset += count
        return offset

    def _decrypt_once(self, size: int, buffer: Any) -> int:
        """One SSL_read: bytes decrypted, 0 at the end of the stream (noted in `_ended`), -1 when the BIO holds no
        whole record (or the record was unreadable: the connection is closing)."""
        try:
            count: int = self._decrypt(size, buffer)
        except (ssl.SSLError, OSError) as exc:
            count = self._read_failed(exc)
        if count == 0:
            self._ended = True
        return count

    def _read_failed(self, exc: ssl.SSLError | OSError) -> int:
        """What an SSL_read's exception means: -1 when the BIO holds no whole record, 0 at the end of the stream
        (close_notify, or TCP's EOF without it); unreadable bytes close the connection (-1)."""
        if isinstance(exc, (ssl.SSLWantReadError, ssl.SSLWantWriteError)):
            return -1
        if isinstance(exc, (ssl.SSLZeroReturnError, ssl.SSLEOFError)):
            return 0
        self._unreadable(exc)
        return -1

    def _decrypt_bytes(self) -> bytes:
        try:
            data: bytes = self._decrypt(_READ_BUFFER_BYTES)
        except (ssl.SSLError, OSError) as exc:
            if self._read_failed(exc) == 0:
                self._ended = True
            return b""
        if not data:
            self._ended = True
        return data

    def _unreadable(self, exc: BaseException) -> None:
        peer = self.get_extra_info("peername")
        log.warning("event=connection_closed reason=tls_record_unreadable peer=%s error=%s", peer, exc)
        self._send_outgoing()  # OpenSSL's alert
        self._close_tcp(abort=False)

    def _read_later(self) -> None:
        self._reading_scheduled = False
        if self._app is not None and not self._app_paused:
            self._read_records()

    # ------------------------------------------------------------------------------------------ records out

    def _send_outgoing(self) -> None:
        data = self._outgoing.read()
        if data and self._tcp is not None and not self._lost:
            self._tcp.write(data)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._open or not data:
            return  # closed: as the loop's layers, a write after close is dropped
        try:
            self._encrypt(data)
        except (ssl.SSLError, OSError) as exc:
            log.warning("event=connection_closed reason=tls_write_failed peer=%s error=%s",
                        self.get_extra_info("peername"), exc)
            self._close_tcp(abort=True)
            return
        self._tcp.write(self._outgoing.read())  # type: ignore[union-attr]

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self._tcp.get_write_buffer_size() if self._tcp is not None else 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._tcp.get_write_buffer_limits() if self._tcp is not None else (0, 0)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self._tcp is not None:
            self._tcp.set_write_buffer_limits(high, low)

    # ------------------------------------------------------------------------------------------ transport API

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self._tls
        if name == "sslcontext":
            return self._context
        if name == "peercert":
            return self._tls.getpeercert()
        if name == "cipher":
            return self._tls.cipher()
        if name == "compression":
            return self._tls.compression()
        return self._tcp.get_extra_info(name, default) if self._tcp is not None else default

    def is_reading(self) -> bool:
        return not self._app_paused and self._open

    def pause_reading(self) -> None:
        if not self._app_paused:
            self._app_paused = True
            if self._tcp is not None and not self._lost:
                self._tcp.pause_reading()

    def resume_reading(self) -> None:
        if self._app_paused:
            self._app_paused = False
            if self._tcp is not None and not self._lost:
                self._tcp.resume_reading()
            # records read while paused (or the EOF behind them) are given in a later callback, not inside the
            # protocol's own call
            if (self._incoming.pending or self._decrypted_pending() or self._ended or self._incoming.eof) \
                    and not self._reading_scheduled:
                self._reading_scheduled = True
                asyncio.get_running_loop().call_soon(self._read_later)

    def is_closing(self) -> bool:
        return not self._open

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._app

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._app = protocol
        self._app_buffered = isinstance(protocol, asyncio.BufferedProtocol)

    def close(self) -> None:
        """Our close_notify after what is written, then the TCP close (which sends what is buffered first)."""
        if not self._open:
            return
        self._open = False
        try:
            self._tls.unwrap()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass  # the peer's close_notify is not waited for (Kafka's broker does not wait either)
        except (ssl.SSLError, OSError):
            pass  # a broken connection: the TCP close follows anyway
        self._send_outgoing()
        self._close_tcp(abort=False)

    def abort(self) -> None:
        self._open = False
        self._close_tcp(abort=True)

    def _close_tcp(self, *, abort: bool) -> None:
        self._open = False
        if self._tcp is None or self._lost:
            return
        if abort:
            self._tcp.abort()
        elif not self._tcp.is_closing():
            self._tcp.close()
