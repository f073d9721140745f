"""Apache Kafka's own command-line tools (from the embedded broker's jars) against our coordinator."""
from __future__ import annotations

import subprocess

from coordinator.embedded import ensure_jars

GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


def consumer_groups(port: int, *args: str) -> str:
    command = ["java", "-cp", f"{ensure_jars()}/*", GROUP_COMMAND, "--bootstrap-server", f"127.0.0.1:{port}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]
