"""A real single-node Apache Kafka broker (KRaft, broker+controller) run from the machine's Java.

Used by the tests, `coordinator kafka` and, when no cluster is given, the coordinator itself. The broker is
the genuine Apache Kafka release pinned in pom.xml, not a stand-in. Start formats the log directory the first
time (fresh cluster id), writes server.properties with free loopback ports and waits until a Metadata request
is answered; stop sends SIGTERM and SIGKILL after a timeout. The JVM is told to die with the process that
started it (PR_SET_PDEATHSIG), and an atexit hook stops any broker still running, so no JVM outlives us.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import ctypes
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Mapping

from coordinator.embedded.jars import ensure_jars

log = logging.getLogger("coordinator.embedded")

_PR_SET_PDEATHSIG = 1
_LIVE_BROKERS: set["EmbeddedKafka"] = set()
_STARTED_PIDS: list[int] = []


class BrokerStartError(RuntimeError):
    """The broker did not come up; the message carries the tail of its log."""


def started_pids() -> list[int]:
    """PIDs of every broker JVM this process started (the tests check none is left running)."""
    return list(_STARTED_PIDS)


def process_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def random_cluster_id() -> str:
    """Kafka's Uuid.randomUuid().toString(): URL-safe base64 of 16 random bytes, never starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _metadata_v0_request(correlation_id: int) -> bytes:
    client_id = b"embedded-probe"
    body = struct.pack(">hhih", 3, 0, correlation_id, len(client_id)) + client_id + struct.pack(">i", 0)
    return struct.pack(">i", len(body)) + body


def _broker_count(response: bytes) -> int:
    # Metadata v0 response: correlation id, then the brokers array count
    return struct.unpack_from(">i", response, 4)[0]


class EmbeddedKafka:
    """Async context manager around one broker process; `start()` again reuses the same data dir and ports."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        extra_properties: Mapping[str, str] | None = None,
        heap_mb: int = 768,
        startup_timeout_s: float = 120.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        self._owns_data_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="embedded-kafka-"))
        self.extra_properties = dict(extra_properties or {})
        self.heap_mb = heap_mb
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.port = free_port()
        self.controller_port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    # -- async API ------------------------------------------------------------------------------------
    async def __aenter__(self) -> "EmbeddedKafka":
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
        self.remove_data()

    async def start(self) -> None:
        await asyncio.to_thread(self._prepare)
        self._spawn()  # in the caller's thread: PDEATHSIG is tied to the thread that forks
        deadline = time.monotonic() + self.startup_timeout_s
        while not await asyncio.to_thread(self._ready, deadline):
            await asyncio.sleep(0.25)

    async def stop(self) -> None:
        await asyncio.to_thread(self.stop_blocking)

    # -- blocking API (sync fixtures, CLI, atexit) ------------------------------------------------------
    def start_blocking(self) -> None:
        self._prepare()
        self._spawn()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._ready(deadline):
            time.sleep(0.25)

    def stop_blocking(self) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("event=kafka_stop_timeout pid=%s action=SIGKILL", process.pid)
                self._kill()
        self._process = None
        _LIVE_BROKERS.discard(self)
        log.info("event=kafka_stopped bootstrap=%s", self.bootstrap)

    def remove_data(self) -> None:
        if self._owns_data_dir and not self.running:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # -- internals ------------------------------------------------------------------------------------
    def _prepare(self) -> None:
        if self.running:
            raise RuntimeError(f"broker already running at {self.bootstrap}")
        self.jars = ensure_jars()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        if not (self.data_dir / "logs" / "meta.properties").exists():
            self._format()

    def _properties(self) -> dict[str, str]:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir / "logs"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
        }
        props.update(self.extra_properties)
        return props

    def _write_config(self) -> None:
        # ports are fixed per instance, so a restart on the same data dir keeps its bootstrap address
        lines = [f"{key}={value}" for key, value in self._properties().items()]
        (self.data_dir / "server.properties").write_text("\n".join(lines) + "\n")
        (self.data_dir / "log4j2.properties").write_text(
            "status = warn\n"
            "appender.file.type = File\n"
            "appender.file.name = FILE\n"
            f"appender.file.fileName = {self.log_file}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\n"
            "rootLogger.appenderRef.file.ref = FILE\n"
        )

    def _java_command(self, main_class: str, *args: str) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise BrokerStartError("java is not on PATH (Java 17+ is needed to run Apache Kafka)")
        return [
            java, f"-Xmx{self.heap_mb}m", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp", f"{self.jars}/*", main_class, *args,
        ]

    def _format(self) -> None:
        command = self._java_command(
            "kafka.tools.StorageTool", "format", "-t", random_cluster_id(),
            "-c", str(self.data_dir / "server.properties"),
        )
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise BrokerStartError(f"kafka-storage format failed:\n{result.stdout}\n{result.stderr}")

    def _spawn(self) -> None:
        with open(self.data_dir / "stdout.log", "ab") as out:
            self._process = subprocess.Popen(
                self._java_command("kafka.Kafka", str(self.data_dir / "server.properties")),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        _STARTED_PIDS.append(self._process.pid)
        _LIVE_BROKERS.add(self)

    def _ready(self, deadline: float) -> bool:
        """One readiness check: True once Metadata is answered; raises if the broker died or the deadline passed."""
        if self._probe_once():
            log.info("event=kafka_started bootstrap=%s pid=%s data_dir=%s", self.bootstrap, self.pid, self.data_dir)
            return True
        self._check_alive()
        if time.monotonic() > deadline:
            self._kill()
            raise BrokerStartError(f"broker not ready after {self.startup_timeout_s}s\n{self._log_tail()}")
        return False

    def _probe_once(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                sock.sendall(_metadata_v0_request(1))
                size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
                return _broker_count(_recv_exactly(sock, size)) >= 1
        except (OSError, struct.error):
            return False

    def _check_alive(self) -> None:
        if self._process is not None and self._process.poll() is not None:
            code = self._process.returncode
            self._process = None
            _LIVE_BROKERS.discard(self)
            raise BrokerStartError(f"broker exited with code {code}\n{self._log_tail()}")

    def _kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def _log_tail(self, lines: int = 40) -> str:
        chunks = []
        for name in ("stdout.log", "broker.log"):
            path = self.data_dir / name
            if path.exists():
                chunks.append(f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(chunks)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return bytes(buf)


@atexit.register
def _stop_leftover_brokers() -> None:
    for broker in list(_LIVE_BROKERS):
        broker.stop_blocking()
