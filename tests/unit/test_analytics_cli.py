"""`coordinator analyze`'s arguments and the report's HTML, without Spark."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from analytics.cli import parse_time
from analytics.report import ReportData, render_html
from analytics.tables import TimeRange
from coordinator.cli import build_parser

NOW_MS = 1_795_449_600_000


@pytest.mark.parametrize(("text", "expected"), [
    ("1700000000000", 1_700_000_000_000),
    ("2026-11-23T15:00:00Z", 1_795_446_000_000),
    ("2026-11-23T16:00:00+01:00", 1_795_446_000_000),
    ("2026-11-23T15:00:00", 1_795_446_000_000),  # UTC unless an offset is given
    ("2026-11-23", 1_795_392_000_000),
    ("90s", NOW_MS - 90_000),
    ("30m", NOW_MS - 1_800_000),
    ("2h", NOW_MS - 7_200_000),
    ("7d", NOW_MS - 7 * 86_400_000),
])
def test_time_arguments(text: str, expected: int) -> None:
    assert parse_time(text, now_ms=NOW_MS) == expected


@pytest.mark.parametrize("text", ["yesterday", "2h ago", "-5", "2026-13-01"])
def test_bad_time_arguments_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_time(text, now_ms=NOW_MS)


def test_the_parser_knows_analyze() -> None:
    args = build_parser().parse_args(["analyze", "--bootstrap-server", "k:9092", "--since", "2h", "--follow",
                                      "--kafka-option", "security.protocol=SSL"])
    assert args.command == "analyze" and args.follow and args.kafka_option == [("kafka.security.protocol", "SSL")]


def test_the_service_never_imports_pyspark() -> None:
    """The CLI with every sub-command, and the service's modules, load without pyspark (a fresh interpreter)."""
    check = ("import sys, coordinator.cli, coordinator.app; coordinator.cli.build_parser(); "
             "assert 'pyspark' not in sys.modules, 'pyspark imported'")
    subprocess.run([sys.executable, "-c", check], check=True, timeout=60)


def test_bucket_width_is_round_and_bounded() -> None:
    assert TimeRange(0, 60_000).bucket_ms() == 1_000
    assert TimeRange(0, 3_600_000).bucket_ms() == 60_000
    assert TimeRange(0, 30 * 86_400_000).bucket_ms() == 86_400_000
    assert 365 * 86_400_000 / TimeRange(0, 365 * 86_400_000).bucket_ms() <= 60


def test_an_empty_report_says_so_instead_of_drawing() -> None:
    page = render_html(ReportData(time_range=(0, 1), events=0, skipped={"not_json": 2}, summary=[], reasons=[],
                                  over_time=[], bucket_ms=1_000, durations=[], failing=[], slowest=[],
                                  member_events=[]))
    assert page.count('class="empty"') == 3 and "<script" not in page and "http" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert "<td>not_json</td><td>2</td>" in page
