"""The test support that drains a child's pipes: a child writing far more than a pipe holds (64 KiB) exits, and
everything it wrote is kept."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from tests.support.pipes import DrainedFile, DrainedPipe

_CHATTY = "import sys\nfor n in range(20_000): sys.stderr.write(f'line {n:05d} ' + 'x' * 40 + '\\n')\nprint('done')"
_WRITTEN = 20_000 * 52


async def test_an_asyncio_child_writing_a_megabyte_to_stderr_exits_and_all_of_it_is_kept() -> None:
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", _CHATTY, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    stderr = DrainedPipe(process.stderr)
    try:
        assert process.stdout is not None
        assert await asyncio.wait_for(process.stdout.readline(), 30) == b"done\n"  # not blocked on stderr
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = await stderr.ended()
    assert len(text) == _WRITTEN and text.endswith("line 19999 " + "x" * 40 + "\n")


def test_a_popen_child_writing_a_megabyte_to_stderr_exits_and_all_of_it_is_kept() -> None:
    process = subprocess.Popen([sys.executable, "-c", _CHATTY], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    stderr = DrainedFile(process.stderr)
    try:
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.stdout is not None and process.stdout.read() == "done\n"
    text = stderr.ended(10)
    assert len(text) == _WRITTEN and text.startswith("line 00000 ")
