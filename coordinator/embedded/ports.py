"""Ports for a process started later (an embedded broker's listeners, Jaeger's, a test's coordinator or relay):
taken below the kernel's ephemeral range. Ports in that range are taken at any moment by any process's outgoing
connection and by every bind to port 0 (other brokers, clients, JVMs), so a port found free there may be someone
else's by the time it is bound, or while a restarted process is down (a restarted broker binds its stored ports
again); a port below it is taken only by an explicit bind."""
from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 10_000  # above the well-known and registered services a machine usually runs
_rng = random.Random()  # seeded from the OS: each test worker its own choices
_chosen: set[int] = set()  # handed out by this process already (maybe not bound yet): never again


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_run(length: int = 1) -> int:
    """A port P with P .. P+length-1 all free on loopback now, below the ephemeral range, none handed out before
    by this process."""
    high = _ephemeral_low() - length
    for _ in range(500):
        start = _rng.randrange(_LOWEST, high)
        ports = range(start, start + length)
        if _chosen.intersection(ports) or not all(_bindable(port) for port in ports):
            continue
        _chosen.update(ports)
        return start
    raise AssertionError(f"no run of {length} free ports below the ephemeral range")


def free_port() -> int:
    """One such port."""
    return free_run(1)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False
