"""Hypothesis-driven fuzzing of request bodies for every served (API, version), through a real server.

Random bytes behind a valid header must get a response or a closed connection; well-formed random bodies
(kio's own strategies) must always get a response. Either way the server must stay up and never log a handler
failure (that would be our bug, not the peer's). The server runs on its own loop in a thread so hypothesis can
drive plain blocking sockets."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import apis, codec
from coordinator.server.handlers import SERVED_APIS
from protocol.apis import ApiKey
from tests.unit.test_server_env import RunningServer

ALL_SERVED = [(api.key, v) for api in SERVED_APIS.values() for v in range(api.min_version, api.max_version + 1)]
PARKING_APIS = {ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP}  # may legitimately wait for a rebalance


class FailureLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.failures: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.failures.append(record.getMessage())


class ThreadedServer:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        self.env = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    async def _start(self) -> RunningServer:
        return await RunningServer(idle_timeout_ms=60_000, shutdown_grace_ms=100).__aenter__()

    def __exit__(self, *exc_info: object) -> None:
        asyncio.run_coroutine_threadsafe(self.env.__aexit__(None, None, None), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.env.port), timeout=2)
        return sock


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadedServer]:
    failures = FailureLog()
    logging.getLogger("coordinator").addHandler(failures)
    try:
        with ThreadedServer() as running:
            running.failures = failures  # type: ignore[attr-defined]
            yield running
    finally:
        logging.getLogger("coordinator").removeHandler(failures)


def _exchange(sock: socket.socket, frame: bytes) -> bytes | None:
    """The response frame, or None if the server closed the connection."""
    sock.sendall(frame)
    try:
        size_bytes = _read_exactly(sock, 4)
        if size_bytes is None:
            return None
        return _read_exactly(sock, struct.unpack(">i", size_bytes)[0])
    except ConnectionResetError:
        return None


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _assert_server_alive(server: ThreadedServer) -> None:
    with server.connect() as sock:
        body = apis.request_class(ApiKey.API_VERSIONS, 0)()
        response = _exchange(sock, codec.encode_request(9, "probe", body))
        assert response is not None and struct.unpack_from(">i", response)[0] == 9
    assert server.failures.failures == []  # type: ignore[attr-defined]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(api_version=st.sampled_from(ALL_SERVED), body=st.binary(max_size=120))
def test_random_bytes_get_a_response_or_a_closed_connection(server: ThreadedServer, api_version, body) -> None:
    api_key, version = api_version
    header = struct.pack(">hhih", api_key, version, 31, 4) + b"fuzz"
    if apis.is_flexible(api_key, version):
        header += b"\x00"
    payload = header + body
    with server.connect() as sock:
        try:
            response = _exchange(sock, struct.pack(">i", len(payload)) + payload)
        except socket.timeout:
            assert api_key in PARKING_APIS
            return
    if response is not None:
        assert struct.unpack_from(">i", response)[0] == 31
    _assert_server_alive(server)


@pytest.mark.parametrize(("api_key", "version"), ALL_SERVED)
def test_well_formed_random_requests_are_always_answered(server: ThreadedServer, api_key: int, version: int) -> None:
    cls = apis.request_class(api_key, version)

    @settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=st.from_type(cls))
    def exchange(body) -> None:
        try:
            frame = codec.encode_request(57, "fuzz", body)
        except Exception:  # kio's strategies can produce values its own writer refuses
            return
        with server.connect() as sock:
            try:
                response = _exchange(sock, frame)
            except socket.timeout:
                assert api_key in PARKING_APIS
                return
        if response is None:
            # only a request kio cannot read back (an i64 duration past timedelta's range) may be refused
            with pytest.raises(Exception, match="timedelta"):
                codec.decode_request(frame[4:])
            return
        correlation_id, decoded = codec.decode_response(api_key, version, response)
        assert correlation_id == 57

    exchange()
    assert server.failures.failures == []  # type: ignore[attr-defined]
