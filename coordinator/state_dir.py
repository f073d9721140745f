"""Where the demo keeps its state (its Jaeger's URL, the traces it saved), read by the demo and the trace viewer."""
from __future__ import annotations

import os
from pathlib import Path


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kafka-group-coordinator"
