"""Provision jars from Maven Central, once per machine: Apache Kafka's broker jars, and Spark's Kafka connector.

Each set is a pom beside this file that pins a release (pom.xml: Kafka; spark-kafka-pom.xml: the connector for
the pinned pyspark). Maven copies every run-time jar into a cache directory keyed by the pom's content hash, so
a changed pin gets a fresh directory and an unchanged one is reused without touching the network. A file lock
makes concurrent first runs (several test processes) safe.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("coordinator.embedded")

POM_PATH = Path(__file__).with_name("pom.xml")
# a directory is only trusted once this marker exists (Maven may die half-way through a copy)
_COMPLETE_MARKER = ".complete"


class JarProvisioningError(RuntimeError):
    """Maven could not provide the jars; the message carries Maven's own output."""


@dataclass(frozen=True)
class JarSet:
    """One pom's run-time jars: `name` prefixes the cache directory, `version_property` names the pom property
    that pins the release, `expected_glob` is a jar that must be there for the copy to count as done."""

    name: str
    pom: Path
    version_property: str
    expected_glob: str

    def version(self) -> str:
        text = self.pom.read_text()
        tag = f"<{self.version_property}>"
        start = text.index(tag) + len(tag)
        return text[start : text.index(f"</{self.version_property}>", start)]

    def directory(self) -> Path:
        digest = hashlib.sha256(self.pom.read_bytes()).hexdigest()[:12]
        return cache_root() / f"{self.name}-{self.version()}-{digest}" / "jars"

    def ensure(self) -> Path:
        """Return the directory holding the jars, running Maven the first time only."""
        target = self.directory()
        if (target / _COMPLETE_MARKER).exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / ".lock", "w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)  # another process may be downloading the same jars
            if not (target / _COMPLETE_MARKER).exists():
                self._download_into(target)
        return target

    def _download_into(self, target: Path) -> None:
        mvn = shutil.which("mvn")
        if mvn is None:
            raise JarProvisioningError(f"Maven (mvn) is not on PATH; it is needed once to fetch the {self.name} jars")
        staging = Path(tempfile.mkdtemp(prefix="jars-", dir=target.parent))
        log.info("event=jars_download set=%s version=%s target=%s", self.name, self.version(), target)
        command = [
            mvn, "-q", "-B", "-f", str(self.pom), "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not any(staging.glob(self.expected_glob)):
            shutil.rmtree(staging, ignore_errors=True)
            raise JarProvisioningError(
                f"mvn exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
            )
        (staging / _COMPLETE_MARKER).touch()
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)


KAFKA_JARS = JarSet("kafka", POM_PATH, "kafka.version", "kafka_2.13-*.jar")
# Spark's Kafka source for the analytics job; pyspark's own jars are not in it (see the pom)
SPARK_KAFKA_JARS = JarSet("spark-kafka", Path(__file__).with_name("spark-kafka-pom.xml"), "spark.version",
                          "spark-sql-kafka-0-10_2.13-*.jar")


def cache_root() -> Path:
    configured = os.environ.get("COORDINATOR_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "kafka-group-coordinator"


def kafka_version() -> str:
    return KAFKA_JARS.version()


def jar_dir() -> Path:
    return KAFKA_JARS.directory()


def ensure_jars() -> Path:
    """Return the directory holding the broker's jars, running Maven the first time only."""
    return KAFKA_JARS.ensure()


def ensure_spark_kafka_jars() -> list[Path]:
    """The connector's jars for `spark.jars` (Maven the first time only)."""
    return sorted(SPARK_KAFKA_JARS.ensure().glob("*.jar"))
