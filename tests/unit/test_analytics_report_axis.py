"""The analytics report's count axes tick at whole numbers (a 60-s demo's report read "1.2, 2.5, 3.8 rebalances")."""

from __future__ import annotations

import re

from analytics.report import _count_max, _y_axis


def test_count_axes_tick_at_whole_numbers_and_hold_the_largest_count() -> None:
    for largest in range(0, 2001):
        top = _count_max(largest)
        assert top >= largest and top % 4 == 0, largest
        labels = re.findall(r'text-anchor="end">([^<]+)</text>', "".join(_y_axis(top)))
        assert len(labels) == 5 and all(label.isdigit() for label in labels), (largest, labels)
        assert top <= max(4, 2 * largest), (largest, top)  # not much emptier than it must be
    assert [_count_max(n) for n in (1, 5, 9, 17, 41, 99)] == [4, 8, 12, 20, 60, 100]
