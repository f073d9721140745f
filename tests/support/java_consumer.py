"""Run Apache Kafka's Java consumer (GroupConsumer.java, kafka-clients from the embedded broker's jars) from tests.

The Java program is compiled once per machine into the cache, keyed by its source and the jar set (javac costs
~4 s; a launch of the compiled class ~0.5 s, against ~4.5 s for a single-file source launch every time). Each
`JavaConsumer` is one JVM whose stdout line protocol (see GroupConsumer.java) is parsed by a reader thread into
`records`, `assignment`, `committed` and `events`; tests wait on those with `wait_for`. The JVM dies with the test
process (PR_SET_PDEATHSIG), and `close()` ends it the way a user would (stdin closed → consumer.close() →
LeaveGroup).
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from coordinator.embedded import ensure_jars
from coordinator.embedded.broker import die_with_parent, process_start_ticks
from coordinator.embedded.jars import cache_root

JAVA_DIR = Path(__file__).with_name("java")
SOURCE = JAVA_DIR / "GroupConsumer.java"
LOG_CONFIG = JAVA_DIR / "log4j2.properties"
_STARTED: list[tuple[int, int | None]] = []  # (pid, start ticks)
_LIVE: set["JavaConsumer"] = set()


def started_processes() -> list[tuple[int, int | None]]:
    """(pid, start ticks) of every Java consumer JVM started by this process (the test session checks none is
    left)."""
    return list(_STARTED)


def compiled_classes() -> Path:
    """Directory holding GroupConsumer.class, compiled the first time (file lock: parallel test runs are safe)."""
    jars = ensure_jars()
    digest = hashlib.sha256(SOURCE.read_bytes() + str(jars).encode()).hexdigest()[:12]
    target = cache_root() / f"java-consumer-{digest}"
    if (target / "GroupConsumer.class").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".java-consumer.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        if not (target / "GroupConsumer.class").exists():
            javac = shutil.which("javac")
            if javac is None:
                raise RuntimeError("javac is not on PATH (a JDK 17+ is needed to build the Java test consumer)")
            staging = Path(tempfile.mkdtemp(prefix="java-consumer-", dir=target.parent))
            result = subprocess.run([javac, "-nowarn", "-cp", f"{jars}/*", "-d", str(staging), str(SOURCE)],
                                    capture_output=True, text=True, timeout=300)
            if result.returncode != 0:
                shutil.rmtree(staging, ignore_errors=True)
                raise RuntimeError(f"javac {SOURCE} failed:\n{result.stdout}\n{result.stderr}")
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
    return target


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: str | None


def _partitions(field: str) -> set[tuple[str, int]]:
    parsed = set()
    for name in filter(None, field.split(",")):
        topic, _, partition = name.rpartition("-")
        parsed.add((topic, int(partition)))
    return parsed


class JavaConsumer:
    """One Java KafkaConsumer in a group (auto-commit off, commitSync after every poll that returned records)."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topic: str,
        *,
        assignor: str = "range",
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        max_records: int | None = None,
        client_id: str = "java-group-consumer",
        group_instance_id: str | None = None,
        properties: Mapping[str, str] | None = None,
        heap_mb: int = 128,
        group_protocol: str = "classic",
    ) -> None:
        args = [
            "--bootstrap", bootstrap, "--group", group, "--topic", topic, "--assignor", assignor,
            "--session-timeout-ms", str(session_timeout_ms), "--heartbeat-interval-ms", str(heartbeat_interval_ms),
            "--client-id", client_id,
        ]
        if max_records is not None:
            args += ["--max-records", str(max_records)]
        if group_instance_id is not None:
            args += ["--group-instance-id", group_instance_id]
        if group_protocol == "consumer":  # KIP-848: `assignor` names the coordinator's (uniform, range)
            args += ["--group-protocol", "consumer", "--remote-assignor", assignor]
        for name, value in (properties or {}).items():
            args += ["--property", f"{name}={value}"]
        self.command = [
            shutil.which("java") or "java", f"-Xmx{heap_mb}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={LOG_CONFIG}",
            "-cp", f"{ensure_jars()}/*:{compiled_classes()}", "GroupConsumer", *args,
        ]
        self.records: list[Record] = []
        self.assignment: set[tuple[str, int]] = set()
        self.committed: dict[tuple[str, int], int] = {}
        self.events: list[str] = []  # every protocol line, in order
        self.closed = False  # the consumer printed CLOSED (consumer.close() returned)
        self._changed = threading.Condition()
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            preexec_fn=die_with_parent,
        )
        _STARTED.append((self.process.pid, process_start_ticks(self.process.pid)))
        _LIVE.add(self)
        self._reader = threading.Thread(target=self._read, name=f"java-consumer-{self.process.pid}", daemon=True)
        self._reader.start()

    # -- waiting ----------------------------------------------------------------------------------------
    def wait_for(self, condition: Callable[["JavaConsumer"], bool], timeout_s: float = 60.0, what: str = "") -> None:
        """Wait until `condition(self)` holds; AssertionError with the consumer's output if it does not in time."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not condition(self):
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not self._reader.is_alive()):
                    if condition(self):
                        return
                    raise AssertionError(f"Java consumer: {what or 'condition'} not met in {timeout_s}s\n"
                                         f"{self.diagnostics()}")
                self._changed.wait(min(left, 0.5))

    def wait_assigned(self, timeout_s: float = 60.0) -> None:
        self.wait_for(lambda c: bool(c.assignment), timeout_s, "an assignment")

    # -- stopping ---------------------------------------------------------------------------------------
    def close(self, timeout_s: float = 60.0) -> int:
        """Close stdin (the consumer closes, leaving the group) and wait for the JVM; returns its exit code."""
        if self.process.stdin and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        return self._wait(timeout_s)

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM: the JVM's shutdown hook closes the consumer (LeaveGroup) before exiting."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self._wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL: the member vanishes without LeaveGroup (its session has to expire)."""
        if self.process.poll() is None:
            self.process.kill()
        self._wait(30)

    def diagnostics(self) -> str:
        self._stderr.seek(0)
        stderr = self._stderr.read().decode(errors="replace")[-4000:]
        return f"exit={self.process.poll()} last lines={self.events[-20:]}\nstderr:\n{stderr}"

    def _wait(self, timeout_s: float) -> int:
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._reader.join(10)
        _LIVE.discard(self)
        return code

    # -- protocol ---------------------------------------------------------------------------------------
    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self._apply(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def _apply(self, line: str) -> None:
        kind, _, rest = line.partition(" ")
        if kind not in {"STARTED", "ASSIGNED", "REVOKED", "LOST", "RECORD", "COMMITTED", "COMMIT_FAILED", "ERROR",
                        "CLOSED"}:
            return  # not ours (a stray JVM message)
        self.events.append(line)
        if kind == "ASSIGNED":
            self.assignment |= _partitions(rest)
        elif kind in ("REVOKED", "LOST"):
            self.assignment -= _partitions(rest)
        elif kind == "RECORD":
            topic, partition, offset, key = rest.split(" ", 3)
            self.records.append(Record(topic, int(partition), int(offset), None if key == "-" else key))
        elif kind == "COMMITTED":
            for entry in rest.split(","):
                name, _, offset = entry.rpartition("=")
                ((topic, partition),) = _partitions(name)
                self.committed[(topic, partition)] = int(offset)
        elif kind == "CLOSED":
            self.closed = True


@atexit.register
def _kill_leftovers() -> None:
    for consumer in list(_LIVE):
        consumer.kill()
