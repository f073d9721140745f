"""Small Java programs of tests/support/java run against Kafka 4.1.1's own classes (the embedded broker's jars):
compiled once per machine into the cache, keyed by their source and the jar set, then fed a text on stdin."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from coordinator.embedded import ensure_jars
from coordinator.embedded.jars import cache_root

JAVA_DIR = Path(__file__).with_name("java")


def compiled(class_name: str) -> Path:
    """The directory holding `class_name`'s classes, compiled the first time (file lock: parallel workers)."""
    source = JAVA_DIR / f"{class_name}.java"
    jars = ensure_jars()
    digest = hashlib.sha256(source.read_bytes() + str(jars).encode()).hexdigest()[:12]
    target = cache_root() / f"{class_name.lower()}-{digest}"
    if (target / f"{class_name}.class").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{class_name.lower()}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        if not (target / f"{class_name}.class").exists():
            javac = shutil.which("javac")
            assert javac is not None, "a JDK 17+ is needed"
            staging = Path(tempfile.mkdtemp(prefix=f"{class_name.lower()}-", dir=target.parent))
            result = subprocess.run([javac, "-nowarn", "-cp", f"{jars}/*", "-d", str(staging), str(source)],
                                    capture_output=True, text=True, timeout=300)
            assert result.returncode == 0, f"javac {source} failed:\n{result.stdout}\n{result.stderr}"
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
    return target


def run(class_name: str, text: str, *args: str, timeout_s: float = 120) -> list[str]:
    """The program's stdout lines for `text` on its stdin (UTF-8 both ways); its stderr's end on a failure."""
    java = shutil.which("java")
    assert java is not None, "a JDK 17+ is needed"
    result = subprocess.run([java, "-Dfile.encoding=UTF-8", "-Dstdout.encoding=UTF-8", "-cp",
                             f"{ensure_jars()}/*:{compiled(class_name)}", class_name, *args],
                            input=text, capture_output=True, text=True, encoding="utf-8", timeout=timeout_s)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()
