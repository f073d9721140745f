"""A small asyncio Kafka-protocol client: connect, ApiVersions negotiation, pipelined requests matched to their
responses by correlation id, per-request timeouts, one clean close that fails everything outstanding.

Used by tests, benchmarks and the load generator. Requests and responses are kio payload objects; the request
object's class fixes the API key and version, so callers pick versions explicitly (`version_for` helps).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import ssl as ssl_module
import struct
from dataclasses import dataclass
from typing import Any, cast

from kio.schema.api_versions.v3.request import ApiVersionsRequest

from protocol import codec
from protocol.error_codes import Errors
from protocol.errors import ConnectionClosed, ProtocolError, RequestTimedOut
from protocol.framing import FrameReader
from protocol.transports import release_transport_cycle

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_MS = 30_000
_CLIENT_SOFTWARE_NAME = "kafka-group-coordinator-client"
_CLIENT_SOFTWARE_VERSION = "0.1.0"


@dataclass(slots=True)
class _Pending:
    correlation_id: int
    api_key: int
    version: int
    future: asyncio.Future[Any]  # a kio response payload, or the raw frame
    timer: asyncio.TimerHandle | None
    raw: bool


class KafkaClient(asyncio.Protocol):
    """One connection. Create with `await KafkaClient.connect(host, port)`."""

    def __init__(self, client_id: str | None, default_timeout_ms: int) -> None:
        self.client_id = client_id
        self.default_timeout_ms = default_timeout_ms
        self.api_versions: dict[int, tuple[int, int]] = {}
        self.address = "?"  # host:port, for log lines
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader()
        self._pending: collections.deque[_Pending] = collections.deque()
        self._correlation_ids = itertools.count(1)
        self._closed = self._loop.create_future()
        self._close_reason: BaseException | None = None

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        client_id: str | None = "kgc-client",
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        negotiate: bool = True,
        ssl: ssl_module.SSLContext | None = None,
    ) -> KafkaClient:
        """With `ssl`, TLS whose server name (checked against the certificate) is `host`."""
        loop = asyncio.get_running_loop()
        connecting = loop.create_connection(lambda: cls(client_id, timeout_ms), host, port, ssl=ssl,
                                            server_hostname=host if ssl is not None else None)
        _transport, client = await asyncio.wait_for(connecting, timeout_ms / 1000)
        client.address = f"{host}:{port}"
        if negotiate:
            await client.negotiate_versions()
        return client

    # ------------------------------------------------------------------------------------------------ requests

    async def negotiate_versions(self) -> dict[int, tuple[int, int]]:
        """Ask the server for its API ranges (ApiVersions v3) and remember them."""
        request = ApiVersionsRequest(
            client_software_name=_CLIENT_SOFTWARE_NAME, client_software_version=_CLIENT_SOFTWARE_VERSION
        )
        response = await self.request(request)
        if response.error_code != Errors.NONE:
            raise ProtocolError(f"ApiVersions failed with error {int(response.error_code)}")
        self.api_versions = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}
        return self.api_versions

    def version_for(self, api_key: int, highest_known: int) -> int:
        """The highest version both we (`highest_known`) and the server support."""
        low, high = self.api_versions[api_key]
        version = min(high, highest_known)
        if version < low:
            raise ProtocolError(f"no common version for api_key={api_key}: server {low}-{high}")
        return version

    # Any: requests and responses are kio payloads of whichever (API, version) the caller picked; callers read
    # their fields by name, which no one static type covers.
    async def request(self, body: Any, *, timeout_ms: int | None = None) -> Any:
        """Send one request and wait for its decoded response."""
        return await self.send(body, timeout_ms=timeout_ms)

    def send(self, body: Any, *, timeout_ms: int | None = None, raw: bool = False) -> asyncio.Future[Any]:
        """Send now, without waiting; the returned future gets the decoded response (`raw`: the response frame,
        correlation id first, for an answer the caller reads itself). Pipelines freely."""
        correlation_id = next(self._correlation_ids)
        frame = codec.encode_request(correlation_id, self.client_id, body)
        return self._send(frame, correlation_id, int(body.__api_key__), int(body.__version__), timeout_ms, raw)

    def send_raw(
        self, frame: bytes, correlation_id: int, api_key: int, version: int, *, timeout_ms: int | None = None
    ) -> asyncio.Future[Any]:
        """Send a pre-encoded request frame; the future gets the response frame undecoded (for benchmarks)."""
        return self._send(frame, correlation_id, api_key, version, timeout_ms, True)

    def next_correlation_id(self) -> int:
        return next(self._correlation_ids)

    def _send(
        self, frame: bytes, correlation_id: int, api_key: int, version: int, timeout_ms: int | None, raw: bool
    ) -> asyncio.Future[Any]:
        future = self._loop.create_future()
        if self._transport is None or self._closed.done():
            future.set_exception(ConnectionClosed(f"connection is closed: {self._close_reason!r}"))
            return future
        timeout_ms = self.default_timeout_ms if timeout_ms is None else timeout_ms
        timer = None
        if timeout_ms > 0:
            timer = self._loop.call_later(timeout_ms / 1000, self._on_timeout, correlation_id, timeout_ms)
        self._pending.append(_Pending(correlation_id, api_key, version, future, timer, raw))
        self._transport.write(frame)
        return future

    def _on_timeout(self, correlation_id: int, timeout_ms: int) -> None:
        # Responses come in request order, so one lost response leaves the stream unusable: close it all.
        self._fail_all(RequestTimedOut(f"no response to correlation_id={correlation_id} within {timeout_ms} ms"))

    # ------------------------------------------------------------------------------------------------ protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a stream connection's transport

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        try:
            while (frame := self._reader.next_frame()) is not None:
                self._on_response(frame)
        except (ProtocolError, ValueError, LookupError, struct.error) as exc:
            log.warning("bad response from server, closing: %r", exc)
            self._fail_all(ProtocolError(f"bad response: {exc!r}"))

    def _on_response(self, frame: bytes) -> None:
        if not self._pending:
            raise ProtocolError("response with no request outstanding")
        pending = self._pending.popleft()
        if pending.timer is not None:
            pending.timer.cancel()
        if pending.raw:
            result: Any = frame
            correlation_id = codec.response_correlation_id(frame)
        else:
            try:
                correlation_id, result = codec.decode_response(pending.api_key, pending.version, frame)
            except Exception as exc:  # kio's reader refuses it: that request fails, the framing still holds
                if codec.response_correlation_id(frame) != pending.correlation_id:
                    raise ProtocolError(f"undecodable response out of order: {exc!r}") from exc
                log.warning("undecodable response to api %d v%d, failing that request: %r", pending.api_key,
                            pending.version, exc)
                if not pending.future.done():
                    pending.future.set_exception(ProtocolError(f"undecodable response: {exc!r}"))
                return
        if correlation_id != pending.correlation_id:
            raise ProtocolError(f"correlation_id {correlation_id} where {pending.correlation_id} was expected")
        if not pending.future.done():
            pending.future.set_result(result)

    def connection_lost(self, exc: Exception | None) -> None:
        release_transport_cycle(self._transport)  # a client inside the service must not leave it to the collector
        self._fail_all(ConnectionClosed(f"connection lost: {exc!r}" if exc else "connection closed by peer"))

    # ------------------------------------------------------------------------------------------------ closing

    def detach(self) -> asyncio.Transport:
        """Hand the open connection over (nothing outstanding): the caller sets its own protocol on it; this
        client is closed without closing the connection."""
        if self._transport is None or self._pending:
            raise ConnectionClosed("nothing to hand over: the connection is closed or a request is outstanding")
        transport, self._transport = self._transport, None
        self._fail_all(ConnectionClosed("connection handed over"))
        return transport

    @property
    def is_closed(self) -> bool:
        return self._closed.done()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def close(self) -> None:
        self._fail_all(ConnectionClosed("client closed"))
        await self.wait_closed()

    async def abort(self) -> None:
        """Drop the connection at once (a reset, nothing flushed): a crashing client, for tests and load generators."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()
        await self.close()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    def _fail_all(self, error: BaseException) -> None:
        """The one funnel every way of closing goes through: fail what is outstanding, close the socket."""
        if self._close_reason is None:
            self._close_reason = error
        while self._pending:
            pending = self._pending.popleft()
            if pending.timer is not None:
                pending.timer.cancel()
            if not pending.future.done():
                pending.future.set_exception(error)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()
        if not self._closed.done() and (self._transport is None or self._transport.is_closing()):
            self._loop.call_soon(self._mark_closed)

    def _mark_closed(self) -> None:
        if not self._closed.done():
            self._closed.set_result(None)

    async def __aenter__(self) -> KafkaClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
