"""Benchmarks: run as `python -m bench.<name>`; each prints its figures and a final line of JSON."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any


def run_and_print(main: Awaitable[Any], loop: str) -> None:
    """Run a benchmark's `main` on the chosen event loop and print its figures as the final JSON line."""
    if loop == "uvloop":
        import uvloop

        figures = uvloop.run(main)
    else:
        figures = asyncio.run(main)
    print(json.dumps(figures))
