"""When a write the state topic must still get, and that Kafka refused, is sent again.

A tombstone nobody waits for (storage/tombstones.py) and a consumer group's repair write (group/modern/service.py:
memory's value of keys a failed write may have left otherwise in the log) are both sent again until Kafka
acknowledges them. A cluster that refuses fast (an ISR shortage, an ACL change) would answer a resend at once
every round trip: the first one waits `FIRST_RETRY_MS`, each next one twice as long as the one before, up to
`MAX_RETRY_MS` (protocol/retry.py's doubling schedule, as the busy-transaction retries use with their own bounds).
One schedule, so the two agree.
"""

from __future__ import annotations

from protocol.retry import next_pause

FIRST_RETRY_MS = 1_000
MAX_RETRY_MS = 10_000


def next_retry_ms(delay_ms: int, max_ms: int = MAX_RETRY_MS) -> int:
    """The wait after a resend that waited `delay_ms` was refused again."""
    return next_pause(delay_ms, max(max_ms, delay_ms))
