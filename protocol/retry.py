"""One retry schedule for requests a Kafka broker refuses for a moment: a first pause, doubling, each at most a cap.

Used where a refusal is expected to clear within milliseconds (a transaction's markers still being written, two
verifications of one transactional id meeting in a broker): the state writer's CONCURRENT_TRANSACTIONS
(coordinator/storage/native_transactions.py `Backoff`, bounded by the write's deadline) and the relay's busy
TxnOffsetCommit / AddOffsetsToTxn retries (coordinator/server/handlers/txn_verification.py, bounded by a budget);
and, from 1 s to 10 s, the resends of writes Kafka refused that the state topic must still get
(coordinator/rewrite_backoff.py: owed tombstones, consumer groups' repair writes).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T", int, float)


def next_pause(pause: T, max_pause: T) -> T:
    """The pause after `pause`: twice as long, at most `max_pause` (for a schedule kept as its last pause)."""
    return min(pause * 2, max_pause)


def doubling_pauses(first_s: float, max_s: float, *, budget_s: float = math.inf) -> Iterator[float]:
    """`first_s`, doubling, each pause at most `max_s`, for as long as the pauses' sum stays within `budget_s`."""
    pause, waited = first_s, 0.0
    while waited + pause <= budget_s:
        yield pause
        waited += pause
        pause = next_pause(pause, max_s)
