"""The `coordinator` sub-commands, one module each: `add_parser(commands)` registers its parser, whose `run`
default is the coroutine function that runs it. Here: what several of them share."""

from __future__ import annotations

import argparse
import asyncio
import signal


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)

