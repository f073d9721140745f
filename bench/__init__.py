"""Benchmarks: run as `python -m bench.<name>`; each prints its figures and a final line of JSON."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any


def run_and_print(main: Coroutine[Any, Any, Any], loop: str) -> None:
    """Run a benchmark's `main` on the chosen event loop and print its figures as the final JSON line."""
    figures: Any
    if loop == "uvloop":
        import uvloop

        figures = uvloop.run(main)
    else:
        figures = asyncio.run(main)
    print(json.dumps(figures))
