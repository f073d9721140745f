"""`coordinator serve` (any arguments of the `coordinator` command) with a memory report on SIGUSR1, for long
fuzz runs against the relay's listeners (docs/protocol.md).

  python -m tests.fuzz.serve_memory serve --listen 127.0.0.1:0 --bootstrap-server HOST:PORT --event-topic ''
  kill -USR1 <pid>   # one `event=memory_report` line on stderr

The report: RSS, RSS after glibc's malloc_trim, objects the GC policy has frozen, then what only the cyclic
collector could free (`gc.unfreeze()` + a full collection: objects found, RSS after). Objects in frozen cycles
are memory the service can never give back while it runs (coordinator/runtime_health.py); the collection also
stalls the loop once, so take reports between runs, not during one you are timing.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys

from coordinator.cli import main
from tests.fuzz.service import _malloc_trim, _rss_kb

log = logging.getLogger("tests.fuzz.serve_memory")


def report(_signum: int = 0, _frame: object = None) -> None:
    rss_kb = _rss_kb()
    trimmed_kb = _rss_kb() if _malloc_trim() else -1
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    in_cycles = gc.collect()
    after_kb = _rss_kb() if _malloc_trim() else -1
    log.info("event=memory_report rss_kb=%d rss_after_malloc_trim_kb=%d frozen=%d in_frozen_cycles=%d "
             "rss_after_collect_kb=%d allocated_blocks=%d", rss_kb, trimmed_kb, frozen, in_cycles, after_kb,
             sys.getallocatedblocks())


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, report)  # runs on the main thread between bytecodes, i.e. on the loop
    sys.exit(main(sys.argv[1:]))
