"""A child process's output pipe read as it comes and kept. A child that writes more than a pipe holds (64 KiB)
while nobody reads blocks in its write, and a test waiting for it then hangs until its deadline."""

from __future__ import annotations

import asyncio
import threading
from typing import IO


class DrainedPipe:
    """An asyncio subprocess's stdout or stderr, read on the loop until the child closes it."""

    def __init__(self, stream: asyncio.StreamReader | None) -> None:
        assert stream is not None, "the child's stream is not a pipe"
        self._data = bytearray()
        self._task = asyncio.get_running_loop().create_task(self._read(stream))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65_536):
            self._data += chunk

    def text(self) -> str:
        """What the child wrote so far."""
        return self._data.decode(errors="replace")

    async def ended(self, timeout_s: float = 20) -> str:
        """Everything the child wrote, once it closed the pipe (it exited); at most `timeout_s` later, what came."""
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except asyncio.TimeoutError:
            self._task.cancel()
        return self.text()


class DrainedFile:
    """A subprocess.Popen's stdout or stderr (text mode), read by a thread of its own until the child closes it."""

    def __init__(self, stream: IO[str] | None) -> None:
        assert stream is not None, "the child's stream is not a pipe"
        self._parts: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._parts.append(line)

    def text(self) -> str:
        """What the child wrote so far."""
        return "".join(self._parts)

    def ended(self, timeout_s: float = 20) -> str:
        """Everything the child wrote, once it closed the pipe (it exited); at most `timeout_s` later, what came."""
        self._thread.join(timeout_s)
        return self.text()
