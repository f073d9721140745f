"""native_transactions.py's CONCURRENT_TRANSACTIONS backoff, on a fake clock: 1 ms, doubling, at most 20 ms, never
past the write's deadline."""

from __future__ import annotations

from coordinator.storage.native_transactions import Backoff


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_backoff_starts_at_one_millisecond_and_doubles_up_to_twenty() -> None:
    clock = FakeClock()
    backoff = Backoff(clock.now + 10, clock)
    delays = [backoff.delay() for _ in range(8)]
    assert delays == [0.001, 0.002, 0.004, 0.008, 0.016, 0.020, 0.020, 0.020]
    assert backoff.retries == 8


def test_the_backoff_never_waits_past_the_deadline() -> None:
    clock = FakeClock()
    backoff = Backoff(clock.now + 0.005, clock)
    assert backoff.delay() == 0.001
    clock.now += 0.001
    assert backoff.delay() == 0.002
    clock.now += 0.0035
    delay = backoff.delay()
    assert delay is not None and abs(delay - 0.0005) < 1e-9  # what is left, not 4 ms
    clock.now += 0.0005
    assert backoff.delay() is None  # past it: the write fails at its deadline
