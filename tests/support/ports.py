"""Ports a test chooses for a process it starts later: coordinator/embedded/ports.py (below the kernel's ephemeral
range, never handed out twice by one process)."""
from coordinator.embedded.ports import free_port, free_run

__all__ = ["free_port", "free_run"]
