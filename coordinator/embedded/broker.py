"""A real Apache Kafka node (KRaft, broker+controller) run from the machine's Java, alone or in a cluster.

Used by the tests, `coordinator kafka` and, when no cluster is given, the coordinator itself. The broker is
the genuine Apache Kafka release pinned in pom.xml, not a stand-in. `KafkaNode` is one JVM: start formats its
log directory the first time, writes server.properties with loopback ports and waits until a Metadata request
is answered; stop sends SIGTERM and SIGKILL after a timeout. The ports are chosen once per data directory and
kept in it (`ports.json`), so a restart, even by another process, comes back at the same address. The JVM is
told to die with the process that started it (PR_SET_PDEATHSIG), and an atexit hook stops any node still
running, so no JVM outlives us. `EmbeddedKafka` is a single node that is its own controller quorum;
`EmbeddedKafkaCluster` (cluster.py) runs several nodes with one quorum.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import ctypes
import fcntl
import json
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
from typing import IO, Any, Mapping, Self, Sequence

from coordinator.embedded.jars import ensure_jars
from coordinator.embedded.ports import free_port
from coordinator.embedded.secured import SecureListeners

log = logging.getLogger("coordinator.embedded")

_PR_SET_PDEATHSIG = 1
_LIVE_BROKERS: set["KafkaNode"] = set()
_STARTED: list[tuple[int, int | None]] = []  # (pid, start ticks) of every broker JVM started


class BrokerStartError(RuntimeError):
    """The broker did not come up; the message carries the tail of its log."""


def started_processes() -> list[tuple[int, int | None]]:
    """(pid, start ticks) of every broker JVM this process started (the tests check none is left running)."""
    return list(_STARTED)


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (field 3, the state, first), or None when there is no such pid."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot): with the pid it names one process, even once the pid is reused
    (pid_max is often 32,768, and a long test run on a busy machine wraps it)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def process_alive(pid: int, start_ticks: int | None = None) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped, counts as gone); given `start_ticks`, only while
    it is still the process that started then, not another that was handed the same pid."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return False
    return start_ticks is None or int(fields[19]) == start_ticks


def port_is_free(port: int) -> bool:
    """True if a listener could bind 127.0.0.1:`port` now (SO_REUSEADDR, as the JVM's server sockets use, so
    connections of a stopped broker lingering in TIME_WAIT do not count as taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def random_cluster_id() -> str:
    """Kafka's Uuid.randomUuid().toString(): URL-safe base64 of 16 random bytes, never starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the thread that forked it exits (runs between fork and exec)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _metadata_v0_request(correlation_id: int) -> bytes:
    client_id = b"embedded-probe"
    body = struct.pack(">hhih", 3, 0, correlation_id, len(client_id)) + client_id + struct.pack(">i", 0)
    return struct.pack(">i", len(body)) + body


def _broker_ids(response: bytes) -> set[int]:
    # Metadata v0 response: correlation id, then brokers [node_id int32, host string, port int32]
    (count,) = struct.unpack_from(">i", response, 4)
    ids, pos = set(), 8
    for _ in range(count):
        node_id, host_len = struct.unpack_from(">ih", response, pos)
        ids.add(node_id)
        pos += 4 + 2 + host_len + 4
    return ids


class KafkaNode:
    """One Kafka JVM in KRaft combined mode (broker+controller) on loopback; `start` again reuses its data dir
    and ports. The cluster it belongs to is given by `controller_quorum` (default: itself alone) and
    `cluster_id` (default: a fresh one when the data dir is first formatted)."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        node_id: int = 1,
        extra_properties: Mapping[str, str] | None = None,
        heap_mb: int = 768,
        jvm_options: Sequence[str] = (),
        startup_timeout_s: float = 120.0,
        stop_timeout_s: float = 30.0,
        secure: SecureListeners | None = None,
        features: Mapping[str, int] | None = None,
    ) -> None:
        self._owns_data_dir = data_dir is None
        # finalized feature levels set at format time (kafka-storage format --feature), e.g.
        # {"transaction.version": 1} for a cluster whose clients run transactions without KIP-890 part 2
        self.features = dict(features or {})
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="embedded-kafka-"))
        self.node_id = node_id
        self.extra_properties = dict(extra_properties or {})
        self.heap_mb = heap_mb
        self.jvm_options = list(jvm_options)  # after our defaults, so a later -XX flag wins
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.port, self.controller_port = self._stored_ports() or (free_port(), free_port())
        # SASL_SSL and SSL listeners beside PLAINTEXT (secured.py); their ports are kept in ports.json too
        self.secure = secure
        self.sasl_ssl_port, self.ssl_port = self._stored_secure_ports() or (
            (free_port(), free_port()) if secure is not None else (0, 0))
        self.controller_quorum: str | None = None  # "id@host:port,..."; None: this node is the whole quorum
        self.cluster_id: str | None = None
        # readiness: the node's Metadata must list these node ids (a cluster sets all its running nodes)
        self.expected_node_ids: set[int] = {node_id}
        self._process: subprocess.Popen[bytes] | None = None
        self._lock_file: IO[str] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        assert self.secure is not None, "started without secure listeners"
        return f"{self.secure.host}:{self.sasl_ssl_port}"

    @property
    def ssl_bootstrap(self) -> str:
        assert self.secure is not None, "started without secure listeners"
        return f"{self.secure.host}:{self.ssl_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def ports_file(self) -> Path:
        return self.data_dir / "ports.json"

    # -- blocking API (sync fixtures, CLI, atexit) ------------------------------------------------------
    def __enter__(self) -> Self:
        """`with`: start_blocking() on entry; stop_blocking() and remove_data() (a temporary data dir only) on exit,
        as `async with` does for the async API."""
        self.start_blocking()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_blocking()
        self.remove_data()

    def start_blocking(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Prepare the data dir and spawn the JVM without waiting (a cluster spawns all nodes, then waits).
        Call it from a thread that outlives the JVM: PDEATHSIG is tied to the thread that forks."""
        self._prepare()
        self._spawn()

    def wait_ready(self, timeout_s: float | None = None) -> None:
        deadline = time.monotonic() + (self.startup_timeout_s if timeout_s is None else timeout_s)
        while not self._ready(deadline):
            time.sleep(0.25)

    def stop_blocking(self) -> None:
        self.signal_stop()
        self.wait_stopped()

    def signal_stop(self) -> None:
        """Send SIGTERM (Kafka's controlled shutdown) without waiting: a cluster stops all its nodes at once."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)

    def wait_stopped(self) -> None:
        """Wait for the JVM to exit after `signal_stop`, SIGKILL it after `stop_timeout_s`."""
        process = self._process
        if process is None:
            self._release_data_dir()  # prepared but never spawned (a sibling node failed to prepare)
            return
        try:
            process.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("event=kafka_stop_timeout node=%s pid=%s action=SIGKILL", self.node_id, process.pid)
            self._kill()
        self._process = None
        self._release_data_dir()
        _LIVE_BROKERS.discard(self)
        log.info("event=kafka_stopped node=%s bootstrap=%s", self.node_id, self.bootstrap)

    def remove_data(self) -> None:
        if self._owns_data_dir and not self.running:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # -- internals ------------------------------------------------------------------------------------
    def _stored_ports(self) -> tuple[int, int] | None:
        try:
            stored = json.loads(self.ports_file.read_text())
            return int(stored["port"]), int(stored["controller_port"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise BrokerStartError(f"{self.ports_file} is unreadable ({exc}); fix or delete it") from exc

    def _stored_secure_ports(self) -> tuple[int, int] | None:
        try:
            stored = json.loads(self.ports_file.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return (int(stored["sasl_ssl_port"]), int(stored["ssl_port"])) if "ssl_port" in stored else None

    def _prepare(self) -> None:
        if self.running:
            raise RuntimeError(f"broker already running at {self.bootstrap}")
        self.jars = ensure_jars()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        try:
            self._claim_ports()
            self._write_config()
            if not (self.data_dir / "logs" / "meta.properties").exists():
                self._format()
        except BaseException:
            self._release_data_dir()
            raise

    def _lock_data_dir(self) -> None:
        """One running node per data dir, whichever process starts it (held until stop or our exit)."""
        if self._lock_file is not None:
            return
        lock_file = open(self.data_dir / "embedded.lock", "a+")
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.close()
            raise BrokerStartError(f"{self.data_dir} is in use by another running embedded Kafka") from None
        self._lock_file = lock_file

    def _release_data_dir(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()  # closing drops the flock
            self._lock_file = None

    def _claim_ports(self) -> None:
        """Keep the address with the data: store the ports the first time, refuse to start if one is taken."""
        ports = (self.port, self.controller_port) + ((self.sasl_ssl_port, self.ssl_port) if self.secure else ())
        taken = [port for port in ports if not port_is_free(port)]
        if taken:
            raise BrokerStartError(
                f"node {self.node_id}: port(s) {taken} on 127.0.0.1 are in use; this data dir keeps its address "
                f"({self.ports_file}), so stop whatever listens there or use another data dir"
            )
        if self._stored_ports() is None:
            stored = {"node_id": self.node_id, "port": self.port, "controller_port": self.controller_port}
            if self.secure is not None:
                stored.update(sasl_ssl_port=self.sasl_ssl_port, ssl_port=self.ssl_port)
            self.ports_file.write_text(json.dumps(stored) + "\n")

    def _properties(self) -> dict[str, str]:
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.controller_quorum or f"{self.node_id}@127.0.0.1:{self.controller_port}",
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
        if self.secure is not None:
            bound, advertised = self.secure.listeners(self.sasl_ssl_port, self.ssl_port)
            props["listeners"] += "," + bound
            props["advertised.listeners"] += "," + advertised
            props["listener.security.protocol.map"] += ",SASL_SSL:SASL_SSL,SSL:SSL"
            props.update(self.secure.properties())
        props.update(self.extra_properties)
        return props

    def _write_config(self) -> None:
        # ports come from ports.json, so a restart on the same data dir keeps its bootstrap address
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
            java, f"-Xmx{self.heap_mb}m", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true", *self.jvm_options,
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp", f"{self.jars}/*", main_class, *args,
        ]

    def _format(self) -> None:
        command = self._java_command(
            "kafka.tools.StorageTool", "format", "-t", self.cluster_id or random_cluster_id(),
            "-c", str(self.data_dir / "server.properties"),
            *(self.secure.format_arguments() if self.secure is not None else ()),
            *(argument for name, level in self.features.items() for argument in ("--feature", f"{name}={level}")),
        )
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise BrokerStartError(f"kafka-storage format failed:\n{result.stdout}\n{result.stderr}")

    def _spawn(self) -> None:
        with open(self.data_dir / "stdout.log", "ab") as out:
            self._process = subprocess.Popen(
                self._java_command("kafka.Kafka", str(self.data_dir / "server.properties")),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
        _STARTED.append((self._process.pid, process_start_ticks(self._process.pid)))
        _LIVE_BROKERS.add(self)

    def _ready(self, deadline: float) -> bool:
        """One readiness check: True once this node's Metadata lists every expected node; raises if the JVM died
        or the deadline passed."""
        if self.expected_node_ids <= self.probe_node_ids():
            log.info("event=kafka_started node=%s bootstrap=%s pid=%s data_dir=%s",
                     self.node_id, self.bootstrap, self.pid, self.data_dir)
            return True
        self._check_alive()
        if time.monotonic() > deadline:
            self._kill()
            raise BrokerStartError(
                f"node {self.node_id} not ready in time (waiting for node ids {sorted(self.expected_node_ids)} in its "
                f"metadata)\n{self._log_tail()}")
        return False

    def probe_node_ids(self) -> set[int]:
        """Node ids of the live brokers this node's Metadata lists (empty if it does not answer)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                sock.sendall(_metadata_v0_request(1))
                size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
                return _broker_ids(_recv_exactly(sock, size))
        except (OSError, struct.error):
            return set()

    def _check_alive(self) -> None:
        if self._process is None:
            raise BrokerStartError(f"node {self.node_id} is not running (stopped while waiting for it?)")
        if self._process.poll() is not None:
            code = self._process.returncode
            self._process = None
            self._release_data_dir()
            _LIVE_BROKERS.discard(self)
            raise BrokerStartError(f"node {self.node_id} exited with code {code}\n{self._log_tail()}")

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


class AsyncLifecycle:
    """`async with`: start() on entry; stop() and remove_data() (a temporary data dir only) on exit. A mixin listed
    after the class that implements stop_blocking and remove_data (the stubs here only type them)."""

    async def start(self) -> None:
        raise NotImplementedError

    def stop_blocking(self) -> None:
        raise NotImplementedError

    def remove_data(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        await asyncio.to_thread(self.stop_blocking)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
        self.remove_data()


class EmbeddedKafka(KafkaNode, AsyncLifecycle):
    """A single-node Kafka (its own controller quorum) with an async API; the async context manager removes a
    temporary data dir on exit."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, **options: Any) -> None:
        if data_dir is not None and (Path(data_dir) / "cluster.json").exists():
            raise BrokerStartError(f"{data_dir} holds a multi-broker cluster's data; start it with the same --brokers")
        super().__init__(data_dir, **options)

    async def start(self) -> None:
        await asyncio.to_thread(self._prepare)
        self._spawn()  # in the caller's thread: PDEATHSIG is tied to the thread that forks
        deadline = time.monotonic() + self.startup_timeout_s
        while not await asyncio.to_thread(self._ready, deadline):
            await asyncio.sleep(0.25)


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
    leftovers = list(_LIVE_BROKERS)
    for node in leftovers:  # all at once: a cluster's nodes stopped one by one lose their quorum
        node.signal_stop()
    for node in leftovers:
        node.stop_blocking()
