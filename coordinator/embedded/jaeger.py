"""Provision a real Jaeger (v2 all-in-one, `cmd/jaeger`) built from its Go module, once per machine.

The Go module proxy serves github.com/jaegertracing/jaeger as v1.76.0, the commit of the v2.13.0 release.
`go install` refuses it (its go.mod has replace directives), so we download the module, build `./cmd/jaeger`
from a writable copy of it and keep only the binary in the project's cache, behind a stamp file. The first
build takes minutes and ~3 GB of Go caches; later calls return at once. A module build carries no UI assets
(the web UI page is a placeholder), which is why `coordinator jaeger` prefers a `jaeger` binary the user has.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import time
import urllib.request
from typing import Callable
from dataclasses import dataclass
from pathlib import Path

from coordinator.embedded.broker import die_with_parent
from coordinator.embedded.ports import free_port
from coordinator.embedded.jars import cache_root

log = logging.getLogger("coordinator.embedded")

JAEGER_MODULE = "github.com/jaegertracing/jaeger"
JAEGER_MODULE_VERSION = "v1.76.0"  # the module proxy's name for the v2.13.0 release commit
JAEGER_RELEASE = "v2.13.0"
_COMPLETE_MARKER = ".complete"


class JaegerBuildError(RuntimeError):
    """Go could not build Jaeger; the message carries Go's own output."""


def jaeger_build_dir() -> Path:
    return cache_root() / f"jaeger-{JAEGER_RELEASE}"


def built_jaeger() -> Path | None:
    """The module build's binary when it is already in the cache, else None (never builds)."""
    target = jaeger_build_dir()
    return target / "jaeger" if (target / _COMPLETE_MARKER).exists() else None


def ensure_jaeger(progress: Callable[[str], object] = print) -> Path:
    """Return the path of the module-built `jaeger` binary, building it the first time only."""
    target = jaeger_build_dir()
    if (target / _COMPLETE_MARKER).exists():
        return target / "jaeger"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".jaeger.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # another process may be building it right now
        if not (target / _COMPLETE_MARKER).exists():
            _build_into(target, progress)
    return target / "jaeger"


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise JaegerBuildError("Go (go) is not on PATH; it is needed once to build Jaeger from its module")
    return go


def _run(command: list[str], cwd: Path | None = None) -> str:
    env = dict(os.environ, GOFLAGS="-buildvcs=false", CGO_ENABLED="0")
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise JaegerBuildError(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return result.stdout


def _build_into(target: Path, progress: Callable[[str], object]) -> None:
    go = _go()
    progress(f"building Jaeger {JAEGER_RELEASE} from {JAEGER_MODULE}@{JAEGER_MODULE_VERSION} "
             "(once per machine; a few minutes cold)")
    log.info("event=jaeger_build version=%s target=%s", JAEGER_RELEASE, target)
    info = json.loads(_run([go, "mod", "download", "-json", f"{JAEGER_MODULE}@{JAEGER_MODULE_VERSION}"]))
    if info.get("Error") or not info.get("Dir"):
        raise JaegerBuildError(f"go mod download: {info.get('Error', 'no module directory')}")
    staging = Path(tempfile.mkdtemp(prefix="jaeger-", dir=target.parent))
    try:
        source = staging / "src"
        # the module cache is read-only; go build needs to write go.sum updates beside go.mod
        shutil.copytree(info["Dir"], source, copy_function=shutil.copy)
        for path in [source, *source.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
        ldflags = f"-s -w -X {JAEGER_MODULE}/internal/version.latestVersion={JAEGER_RELEASE}"
        _run([go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(staging / "jaeger"), "./cmd/jaeger"],
             cwd=source)
        shutil.rmtree(source)
        (staging / _COMPLETE_MARKER).touch()
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    progress(f"Jaeger {JAEGER_RELEASE} built: {target / 'jaeger'}")


# --- running it ------------------------------------------------------------------------------------------------
class JaegerStartError(RuntimeError):
    """Jaeger did not come up; the message carries the tail of its log."""


@dataclass(frozen=True)
class JaegerBinary:
    path: Path
    has_ui: bool  # a module build serves a placeholder page instead of the UI
    origin: str  # how it was found, for the user


def find_jaeger(given: str | None = None, build: bool = True,
                progress: Callable[[str], object] = print) -> JaegerBinary:
    """The user's `jaeger` (given path, else PATH) — official releases carry the UI — else the module build."""
    if given:
        path = Path(given)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise JaegerStartError(f"--jaeger-bin {given}: not an executable file")
        return JaegerBinary(path, True, f"given: {path}")
    on_path = shutil.which("jaeger")
    if on_path:
        return JaegerBinary(Path(on_path), True, f"from PATH: {on_path}")
    built = built_jaeger() or (ensure_jaeger(progress) if build else None)
    if built is None:
        raise JaegerStartError("no jaeger binary: give --jaeger-bin, put one on PATH, or run scripts/setup.sh")
    return JaegerBinary(built, False, f"module build {JAEGER_RELEASE}: {built} (no UI assets in a module build)")


class EmbeddedJaeger:
    """Jaeger v2 all-in-one on loopback with a minimal configuration: in-memory storage, the OTLP receiver
    (HTTP and gRPC), the query service (HTTP API and UI page) and a health check, each on a free port."""

    def __init__(self, binary: Path | None = None, ui_assets: str | None = None, max_traces: int = 100_000,
                 startup_timeout_s: float = 60.0) -> None:
        self.binary = binary
        self.ui_assets = ui_assets  # a built jaeger-ui directory (index.html), served instead of the placeholder
        self.max_traces = max_traces
        self.startup_timeout_s = startup_timeout_s
        self.otlp_http_port = self.otlp_grpc_port = self.query_port = self.query_grpc_port = self.health_port = 0
        self.work_dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def otlp_http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.otlp_http_port}"

    @property
    def otlp_grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.otlp_grpc_port}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.query_port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> "EmbeddedJaeger":
        """Blocking (well under a second once built). Call it from a thread that outlives Jaeger: the process is
        told to die with the thread that forks it, so no Jaeger outlives us."""
        binary = self.binary or ensure_jaeger()
        self.work_dir = Path(tempfile.mkdtemp(prefix="jaeger-"))
        (self.otlp_http_port, self.otlp_grpc_port, self.query_port, self.query_grpc_port,
         self.health_port) = (free_port() for _ in range(5))
        config = self.work_dir / "config.yaml"
        config.write_text(self._config())
        with open(self.work_dir / "jaeger.log", "ab") as out:
            self._process = subprocess.Popen([str(binary), "--config", str(config)], stdout=out,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             preexec_fn=die_with_parent)
        _LIVE.add(self)
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._healthy():
            if self._process.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise JaegerStartError(f"jaeger exited with code {self._process.returncode}\n{tail}")
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise JaegerStartError(f"jaeger not healthy after {self.startup_timeout_s}s\n{tail}")
            time.sleep(0.05)
        log.info("event=jaeger_started pid=%s query=%s otlp_http=%s otlp_grpc=%s", self.pid, self.query_url,
                 self.otlp_http_endpoint, self.otlp_grpc_endpoint)
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        _LIVE.discard(self)
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = None

    def __enter__(self) -> "EmbeddedJaeger":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        path = None if self.work_dir is None else self.work_dir / "jaeger.log"
        if path is None or not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/status", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def _config(self) -> str:
        ui = f"\n    ui:\n      assets_path: {json.dumps(self.ui_assets)}" if self.ui_assets else ""
        return f"""service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: none
    logs:
      level: warn
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: 127.0.0.1:{self.health_port}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: {self.max_traces}
  jaeger_query:
    storage:
      traces: memstore
    enable_tracing: false  # else it exports its own spans and stalls 10 s on shutdown{ui}
    http:
      endpoint: 127.0.0.1:{self.query_port}
    grpc:
      endpoint: 127.0.0.1:{self.query_grpc_port}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{self.otlp_grpc_port}
      http:
        endpoint: 127.0.0.1:{self.otlp_http_port}
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


_LIVE: set[EmbeddedJaeger] = set()


@atexit.register
def _stop_leftover_jaegers() -> None:
    for jaeger in list(_LIVE):
        jaeger.stop()
