"""protocol/retry.py's schedule, and the two places that use it: the busy-transaction retries' budget and the native
state writer's CONCURRENT_TRANSACTIONS backoff (tests/unit/test_native_transactions_backoff.py has its deadline)."""

from __future__ import annotations

import itertools

import pytest

from coordinator.server.handlers.txn_verification import (BUSY_RETRY_BUDGET_S, BUSY_RETRY_MAX_S,
                                                          busy_retry_pauses)
from protocol.retry import doubling_pauses


def test_the_pauses_double_up_to_the_cap_and_go_on_without_a_budget() -> None:
    pauses = list(itertools.islice(doubling_pauses(0.001, 0.020), 8))
    assert pauses == [0.001, 0.002, 0.004, 0.008, 0.016, 0.020, 0.020, 0.020]


def test_the_pauses_stop_before_their_sum_would_pass_the_budget() -> None:
    assert list(doubling_pauses(0.1, 1.0, budget_s=1.0)) == [0.1, 0.2, 0.4]  # 0.7; a 0.8 more would pass 1.0
    assert list(doubling_pauses(0.5, 0.5, budget_s=0.4)) == []


def test_a_busy_request_is_retried_from_one_millisecond_for_at_most_its_budget() -> None:
    pauses = list(busy_retry_pauses())
    assert pauses[:5] == [0.001, 0.002, 0.004, 0.008, 0.016]
    assert max(pauses) == BUSY_RETRY_MAX_S
    assert sum(pauses) == pytest.approx(BUSY_RETRY_BUDGET_S, abs=BUSY_RETRY_MAX_S)
    assert sum(pauses) <= BUSY_RETRY_BUDGET_S


def test_the_resends_of_refused_writes_double_from_one_second_to_ten() -> None:
    from coordinator.rewrite_backoff import FIRST_RETRY_MS, MAX_RETRY_MS, next_retry_ms

    waits = [FIRST_RETRY_MS]
    for _ in range(6):
        waits.append(next_retry_ms(waits[-1]))
    assert waits == [1_000, 2_000, 4_000, 8_000, 10_000, 10_000, 10_000]
    assert next_retry_ms(20_000) == 20_000  # a first wait above the cap is kept, not cut
    assert MAX_RETRY_MS == 10_000
