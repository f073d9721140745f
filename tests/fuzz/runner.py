"""Drive mutated frames at a Kafka listener over many short connections, while a control group heartbeats.

`run_fuzz(FuzzConfig(target=("127.0.0.1", port)))` is the whole fuzzer; the target is any Kafka listener (our
coordinator, or later the relay's listeners) and the corpus any list of API version ranges. Each short
connection gets a batch of 1..max_batch frames (mostly mutated, some valid), sent in one write and followed by
a half-close; the connection then reads until the server closes it. A server that neither answers nor closes
within `reply_timeout_s` counts as a hang. The control member (its own connection, its own group, never touched
by the corpus) joins, syncs and heartbeats every `control_interval_s` throughout; every answer is recorded.
`ServiceProcess` starts our real coordinator (in-memory store, real timer) as a subprocess, so its RSS and log
are its own.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol import apis
from protocol.apis import ApiKey
from protocol.client import KafkaClient
from protocol.consumer_protocol import Subscription, encode_subscription
from protocol.messages import build, item_class
from tests.fuzz.corpus import CONTROL_GROUP, ApiRange, CorpusFrame, build_corpus
from tests.fuzz.mutate import MUTATIONS, VALUE_MUTATIONS, mutate

_REPO_ROOT = Path(__file__).resolve().parents[2]  # where `-m tests.fuzz.service` resolves, whatever the cwd
ERROR_LINE = re.compile(r"^\S+ \S+ (ERROR|CRITICAL) ", re.MULTILINE)  # ServiceProcess's log format


def served_ranges() -> list[ApiRange]:
    from coordinator.server.handlers import SERVED_APIS

    return [(int(api.key), api.min_version, api.max_version) for api in SERVED_APIS.values()]


def parse_corpus(spec: str) -> list[ApiRange]:
    """`served` (our API table), `KEY:MIN-MAX,...` (e.g. `0:3-11,1:4-17`), or `module:attribute` naming an
    iterable of (key, min, max) tuples or of objects with key/min_version/max_version (like SERVED_APIS)."""
    if spec == "served":
        return served_ranges()
    if re.fullmatch(r"\d+:\d+-\d+(,\d+:\d+-\d+)*", spec):
        return [(int(k), int(lo), int(hi)) for k, lo, hi in re.findall(r"(\d+):(\d+)-(\d+)", spec)]
    module_name, _, attribute = spec.partition(":")
    import importlib

    table = getattr(importlib.import_module(module_name), attribute)
    items: Iterable[Any] = table.values() if isinstance(table, dict) else table
    return [tuple(item) if isinstance(item, tuple) else (int(item.key), item.min_version, item.max_version)
            for item in items]


@dataclass
class FuzzConfig:
    target: tuple[str, int]
    frames: int = 50_000
    seed: int = 13
    corpus: list[ApiRange] = field(default_factory=served_ranges)
    concurrency: int = 16
    max_batch: int = 6
    valid_share: float = 0.1  # frames sent unmutated, so the well-formed paths run too
    decodable_share: float = 0.25  # connections whose frames are all meant to decode (valid or odd values)
    control: tuple[str, int] | None = None  # where the control group heartbeats; None: the target; () none
    control_interval_s: float = 0.1
    control_session_ms: int = 10_000
    reply_timeout_s: float = 15.0
    waves: int = 5  # on_wave is called this many times, evenly spread (memory samples, progress)
    on_wave: Callable[[int, FuzzReport], Any] | None = None


@dataclass
class FuzzReport:
    frames: int = 0
    connections: int = 0
    responses: int = 0
    hangs: int = 0
    refused: int = 0  # connections the server did not accept (reset at connect)
    seconds: float = 0.0
    mutations: collections.Counter = field(default_factory=collections.Counter)
    control_beats: int = 0
    control_errors: collections.Counter = field(default_factory=collections.Counter)
    control_max_rtt_ms: float = 0.0
    waves: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        return {"frames": self.frames, "connections": self.connections, "responses": self.responses,
                "hangs": self.hangs, "refused": self.refused, "seconds": round(self.seconds, 1),
                "frames_per_s": round(self.frames / self.seconds) if self.seconds else 0,
                "control_beats": self.control_beats, "control_errors": dict(self.control_errors),
                "control_max_rtt_ms": round(self.control_max_rtt_ms, 1), "waves": self.waves,
                "mutations": dict(self.mutations.most_common())}


async def run_fuzz(config: FuzzConfig) -> FuzzReport:
    report = FuzzReport()
    corpus = build_corpus(config.corpus)
    control = None
    if config.control != ():
        control = ControlMember(config.control or config.target, config.control_session_ms, report)
        await control.start()
        control_task = asyncio.create_task(control.beat(config.control_interval_s))
    started = time.perf_counter()
    batches = _batches(config, corpus)
    wave_every = max(config.frames // max(config.waves, 1), 1)
    next_wave = wave_every
    lock = asyncio.Lock()

    async def worker() -> None:
        nonlocal next_wave
        for batch in batches:
            await _exchange(config, batch, report)
            async with lock:
                while report.frames >= next_wave and len(report.waves) < config.waves:
                    next_wave += wave_every
                    wave = {"frames": report.frames, "connections": report.connections,
                            "seconds": round(time.perf_counter() - started, 1)}
                    if config.on_wave is not None:
                        wave.update(await config.on_wave(len(report.waves), report) or {})
                    report.waves.append(wave)

    try:
        await asyncio.gather(*(worker() for _ in range(config.concurrency)))
    finally:
        report.seconds = time.perf_counter() - started
        if control is not None:
            control_task.cancel()
            await asyncio.gather(control_task, return_exceptions=True)
            await control.close()
    return report


def _batches(config: FuzzConfig, corpus: list[CorpusFrame]) -> Iterable[tuple[list[str], bytes, int]]:
    """(mutation names, bytes to send, frame count) per connection: one generator shared by the workers, so
    the bytes sent depend on the seed only, not on scheduling."""
    rng = random.Random(config.seed)
    sent = 0
    while sent < config.frames:
        count = min(rng.randint(1, config.max_batch), config.frames - sent)
        # A connection closes at its first bad frame; some connections carry only requests that decode (valid
        # ones and odd values), so the handlers and the group logic get as much traffic as the decoder.
        decodable_only = rng.random() < config.decodable_share
        names, chunks = [], []
        for _ in range(count):
            frame = rng.choice(corpus)
            if rng.random() < config.valid_share:
                names.append("valid")
                chunks.append(frame.frame)
            else:
                name, data = mutate(frame, rng, VALUE_MUTATIONS if decodable_only else MUTATIONS)
                names.append(name)
                chunks.append(data)
        sent += count
        yield names, b"".join(chunks), count


async def _exchange(config: FuzzConfig, batch: tuple[list[str], bytes, int], report: FuzzReport) -> None:
    names, data, count = batch
    report.frames += count
    report.connections += 1
    report.mutations.update(names)
    try:
        reader, writer = await asyncio.open_connection(*config.target)
    except OSError:
        report.refused += 1
        return
    try:
        writer.write(data)
        writer.write_eof()
        received = bytearray()
        async with asyncio.timeout(config.reply_timeout_s):
            while chunk := await reader.read(65_536):
                received += chunk
        report.responses += _count_frames(received)
    except TimeoutError:
        report.hangs += 1
    except OSError:  # reset by the server: it closed with our bytes unread
        pass
    finally:
        writer.transport.abort()


def _count_frames(data: bytes) -> int:
    count, offset = 0, 0
    while offset + 4 <= len(data):
        offset += 4 + struct.unpack_from(">i", data, offset)[0]
        count += offset <= len(data)
    return count


# ---------------------------------------------------------------------------------------------- control


class ControlMember:
    """One consumer in its own group on its own connection: joins, syncs, then heartbeats; records answers."""

    def __init__(self, address: tuple[str, int], session_ms: int, report: FuzzReport) -> None:
        self.address = address
        self.session_ms = session_ms
        self.report = report

    async def start(self) -> None:
        self.client = await KafkaClient.connect(*self.address, client_id="fuzz-control", timeout_ms=30_000)
        member_id = ""
        for _ in range(2):  # KIP-394: the first JoinGroup gets MEMBER_ID_REQUIRED and a member id
            joined = await self.client.request(self._join(member_id))
            member_id = joined.member_id
            if joined.error_code == 0:
                break
        assert joined.error_code == 0, joined
        self.member_id, self.generation_id = joined.member_id, joined.generation_id
        entry = item_class(apis.request_class(ApiKey.SYNC_GROUP, 5), "assignments")
        synced = await self.client.request(build(
            apis.request_class(ApiKey.SYNC_GROUP, 5), group_id=CONTROL_GROUP, generation_id=self.generation_id,
            member_id=self.member_id, group_instance_id=None, protocol_type="consumer", protocol_name="range",
            assignments=(entry(member_id=self.member_id, assignment=b""),)))
        assert synced.error_code == 0, synced

    def _join(self, member_id: str) -> Any:
        import datetime

        cls = apis.request_class(ApiKey.JOIN_GROUP, 9)
        protocol = item_class(cls, "protocols")(name="range", metadata=encode_subscription(Subscription(("t",))))
        return build(cls, group_id=CONTROL_GROUP, session_timeout=datetime.timedelta(milliseconds=self.session_ms),
                     rebalance_timeout=datetime.timedelta(milliseconds=self.session_ms), member_id=member_id,
                     group_instance_id=None, protocol_type="consumer", protocols=(protocol,), reason=None)

    async def beat(self, interval_s: float) -> None:
        body = build(apis.request_class(ApiKey.HEARTBEAT, 4), group_id=CONTROL_GROUP,
                     generation_id=self.generation_id, member_id=self.member_id, group_instance_id=None)
        while True:
            started = time.perf_counter()
            try:
                response = await self.client.request(body)
                code = int(response.error_code)
            except Exception as exc:  # a lost control connection is a finding, not a crash of the fuzzer
                code = type(exc).__name__
            self.report.control_beats += 1
            self.report.control_max_rtt_ms = max(self.report.control_max_rtt_ms,
                                                 (time.perf_counter() - started) * 1000)
            if code != 0:
                self.report.control_errors[code] += 1
                if isinstance(code, str):
                    return
            await asyncio.sleep(interval_s)

    async def close(self) -> None:
        if not self.client.is_closed:
            await self.client.close()


# ---------------------------------------------------------------------------------------------- the service


class ServiceProcess:
    """`python -m tests.fuzz.service` (our server + GroupRuntime, in-memory store) as a subprocess: its own
    RSS, its own log file."""

    def __init__(self, *options: str) -> None:
        self.options = options

    def __enter__(self) -> ServiceProcess:
        self._log = tempfile.NamedTemporaryFile(prefix="coordinator-fuzz-", suffix=".log", delete=False)
        self.log_path = Path(self._log.name)
        self.process = subprocess.Popen([sys.executable, "-m", "tests.fuzz.service", *self.options],
                                        stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=_REPO_ROOT,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("{"):
            self.__exit__(None, None, None)
            raise RuntimeError(f"fuzz service did not start: {line!r}")
        self.port = json.loads(line)["port"]
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def remove_log(self) -> None:
        self.log_path.unlink(missing_ok=True)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def rss_kb(self) -> int:
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def findings(self) -> dict[str, int]:
        """What must never be in the log under fuzzing: tracebacks and ERROR lines."""
        text = self.log_text()
        return {"tracebacks": text.count("Traceback"), "error_lines": len(ERROR_LINE.findall(text)),
                "closed_connections": text.count("event=connection_closed")}
