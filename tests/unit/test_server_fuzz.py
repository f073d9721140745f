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
from tests.support.server import RunningServer

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


# ---------------------------------------------------------------------------------------------- mutation fuzzing
# Mutated valid requests (tests/fuzz: corpus of every served API at its lowest and highest version; null lengths,
# forged lengths, over-long varints, invalid booleans, truncation, trailing garbage, size-prefix lies, unknown
# keys/versions, bit flips, noise) against the real service in its own process, while a control group
# heartbeats on its own connection. `python -m tests.fuzz` runs the same at length (docs/protocol.md).

FUZZ_FRAMES = 50_000
FUZZ_SEED = 13
RSS_GROWTH_BOUND_KB = 8_192  # after the first wave (warm-up); a leak of ~600 bytes per connection would exceed it
RSS_TOTAL_BOUND_KB = 16_384  # from the idle service to the end (a forged frame size once cost +30 MB for good)


def test_corpus_frames_are_byte_for_byte_what_kio_writes() -> None:
    from tests.fuzz.corpus import build_corpus, sample
    from tests.fuzz.runner import served_ranges

    for frame in build_corpus(served_ranges()):
        body = sample(apis.request_class(frame.api_key, frame.version))
        assert frame.frame == codec.encode_request(1, "fuzz", body), (frame.api_key, frame.version)
        assert codec.decode_request(frame.payload).body == body


def test_every_mutation_is_deterministic_and_applies_to_every_corpus_frame() -> None:
    import random

    from tests.fuzz.corpus import build_corpus
    from tests.fuzz.mutate import MUTATIONS
    from tests.fuzz.runner import served_ranges

    for frame in build_corpus(served_ranges()):
        for name, mutation in MUTATIONS.items():
            first, again = mutation(frame, random.Random(7)), mutation(frame, random.Random(7))
            assert first == again and first != frame.frame, (name, frame.api_key, frame.version)


async def test_mutation_fuzzing_finds_no_error_no_traceback_no_hang_and_no_memory_growth() -> None:
    from tests.fuzz.runner import FuzzConfig, FuzzReport, ServiceProcess, run_fuzz

    with ServiceProcess() as service:
        rss_start_kb = service.rss_kb()

        async def sample_rss(_index: int, _report: FuzzReport) -> dict:
            return {"rss_kb": service.rss_kb()}

        report = await run_fuzz(FuzzConfig(target=("127.0.0.1", service.port), frames=FUZZ_FRAMES, seed=FUZZ_SEED,
                                           concurrency=32, max_batch=8, waves=5, on_wave=sample_rss))
        alive = service.alive
        try:
            findings = service.findings()
            log_tail = service.log_text()[-5_000:]
        finally:
            service.remove_log()
    summary = report.summary()
    assert alive, summary
    assert findings["tracebacks"] == 0 and findings["error_lines"] == 0, (findings, log_tail)
    assert findings["closed_connections"] > FUZZ_FRAMES // 20  # bad input was seen and refused, with a log line
    assert report.hangs == 0 and report.refused == 0, summary
    assert report.frames == FUZZ_FRAMES and set(report.mutations) >= {
        "null_length", "forged_length", "overlong_varint", "invalid_bool", "truncate", "trailing_garbage",
        "size_prefix_lie", "unknown_key_version", "boundary_ints", "empty_string", "valid"}
    assert report.responses > FUZZ_FRAMES // 20  # well-formed requests with odd values reached the handlers
    assert report.control_beats >= 10 and not report.control_errors, summary  # every heartbeat answered NONE
    rss = [wave["rss_kb"] for wave in report.waves]
    assert max(rss[1:]) - rss[0] <= RSS_GROWTH_BOUND_KB, rss
    assert max(rss) - rss_start_kb <= RSS_TOTAL_BOUND_KB, (rss_start_kb, rss)
