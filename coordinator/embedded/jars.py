"""Provision Apache Kafka's broker jars from Maven Central, once per machine.

The pom.xml beside this file pins the Kafka release. Maven copies every run-time jar into a cache directory
keyed by the pom's content hash, so a changed pin gets a fresh directory and an unchanged one is reused
without touching the network. A file lock makes concurrent first runs (several test processes) safe.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger("coordinator.embedded")

POM_PATH = Path(__file__).with_name("pom.xml")
# a directory is only trusted once this marker exists (Maven may die half-way through a copy)
_COMPLETE_MARKER = ".complete"


class JarProvisioningError(RuntimeError):
    """Maven could not provide the broker jars; the message carries Maven's own output."""


def cache_root() -> Path:
    configured = os.environ.get("COORDINATOR_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "kafka-group-coordinator"


def kafka_version() -> str:
    text = POM_PATH.read_text()
    start = text.index("<kafka.version>") + len("<kafka.version>")
    return text[start : text.index("</kafka.version>", start)]


def jar_dir() -> Path:
    digest = hashlib.sha256(POM_PATH.read_bytes()).hexdigest()[:12]
    return cache_root() / f"kafka-{kafka_version()}-{digest}" / "jars"


def ensure_jars() -> Path:
    """Return the directory holding the broker's jars, running Maven the first time only."""
    target = jar_dir()
    if (target / _COMPLETE_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # another process may be downloading the same jars
        if not (target / _COMPLETE_MARKER).exists():
            _download_into(target)
    return target


def _download_into(target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarProvisioningError("Maven (mvn) is not on PATH; it is needed once to fetch the Kafka jars")
    staging = Path(tempfile.mkdtemp(prefix="jars-", dir=target.parent))
    log.info("event=kafka_jars_download version=%s target=%s", kafka_version(), target)
    command = [
        mvn, "-q", "-B", "-f", str(POM_PATH), "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
        shutil.rmtree(staging, ignore_errors=True)
        raise JarProvisioningError(
            f"mvn exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    (staging / _COMPLETE_MARKER).touch()
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
