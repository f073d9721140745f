"""The live status line (rich) and the end-of-run summary table."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from coordinator.loadgen.simulation import Progress


def status_text(p: Progress, width: int | None = None, records: int | None = None) -> Text:
    """The live status; with `width`, the short form, cut to fit one line (a wrapped live line redraws badly)."""
    if width is not None:
        return _short_status(p, width, records)
    text = Text()
    text.append(f"{p.elapsed_s:6.1f}s ", style="dim")
    text.append(f"members {p.members_stable}/{p.members} stable  ")
    text.append(f"groups {p.groups_stable}/{p.groups} stable  ", style="green" if p.groups_stable == p.groups else "")
    text.append(f"rebalances {p.rebalances_in_flight} in flight, {p.rebalances_done} done  ")
    text.append(f"failures {p.failures_injected} injected / {p.failures_detected} detected")
    if p.unexpected_errors:
        text.append(f"  unexpected errors {p.unexpected_errors}", style="bold red")
    if p.real:
        text.append(f"  real: {p.real}")
    return text


def _short_status(p: Progress, width: int, records: int | None) -> Text:
    """The parts that fit, most telling first; shown in a fixed order."""
    in_flight = f" (+{p.rebalances_in_flight})" if p.rebalances_in_flight else ""
    parts: list[tuple[int, str, str]] = [  # (priority, text, style)
        (0, f"{p.elapsed_s:4.0f}s", "dim"),
        (0, f"members {p.members_stable}/{p.members} stable", "green" if p.members_stable == p.members else ""),
        (3, f"groups {p.groups_stable}/{p.groups}", ""),
        (1, f"rebalances {p.rebalances_done}{in_flight}", ""),
        (1, f"failures {p.failures_injected} ({p.failures_detected} detected)", ""),
    ]
    if records is not None:
        parts.append((2, f"records {records}", ""))
    if p.unexpected_errors:
        parts.append((0, f"unexpected errors {p.unexpected_errors}", "bold red"))
    room = max(1, width - 1)  # the last column left free: some terminals wrap on it
    chosen: set[int] = set()
    for index in sorted(range(len(parts)), key=lambda i: parts[i][0]):
        trial = chosen | {index}
        if sum(len(parts[i][1]) for i in trial) + 3 * (len(trial) - 1) > room:
            break  # nothing less telling in place of what did not fit
        chosen = trial
    text = Text(no_wrap=True, overflow="ellipsis")
    for i in sorted(chosen):
        if len(text):
            text.append(" · ", style="dim")
        text.append(parts[i][1], style=parts[i][2])
    text.truncate(room, overflow="ellipsis")
    return text


class LiveStatus:
    """A rich Live line on a terminal; elsewhere (CI logs, pipes) a plain line every `every_s` seconds. With
    `fit=True` the line is the short one, cut to the terminal's width; `event()` prints a line above it."""

    def __init__(self, console: Console, every_s: float = 5.0, fit: bool = False) -> None:
        self.console = console
        self.every_s = every_s
        self.fit = fit
        self._live: Live | None = None
        self._last_print = 0.0

    @property
    def width(self) -> int | None:
        """The terminal's width, or None off a terminal (no cutting)."""
        return self.console.width if self.console.is_terminal else None

    def __enter__(self) -> LiveStatus:
        if self.console.is_terminal:
            self._live = Live(Text("starting…"), console=self.console, refresh_per_second=4, transient=self.fit)
            self._live.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def event(self, line: str) -> None:
        self.console.print(Text(line, no_wrap=True, overflow="ellipsis"), highlight=False, soft_wrap=self._live is None)

    def update(self, progress: Progress, records: int | None = None) -> None:
        text = status_text(progress, self.width or 1000, records) if self.fit else status_text(progress)
        if self._live is not None:
            self._live.update(text)
        elif time.monotonic() - self._last_print >= self.every_s:
            self._last_print = time.monotonic()
            self.console.print(text, highlight=False, soft_wrap=self.fit)


def summary_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"coordinator simulate: {summary['groups']} groups × {summary['members_per_group']} members "
                        f"against {summary['coordinator']}", show_header=True, header_style="bold")
    table.add_column("figure")
    table.add_column("value", overflow="fold")
    ok = "[green]yes[/]" if summary["ok"] else "[bold red]NO[/]"
    table.add_row("all checks passed", ok)
    table.add_row("members stable / surviving", f"{summary['members_stable']} / {summary['members_surviving']}")
    table.add_row("groups stable", str(summary["groups_stable"]))
    rebalances = summary["rebalances"]
    table.add_row("rebalances", str(rebalances["count"]))
    for reason, count in rebalances["by_reason"].items():
        table.add_row(f"  reason: {reason}", str(count))
    duration = rebalances["duration_ms"]
    table.add_row("rebalance duration p50 / p99 / max (ms)", _triple(duration))
    failures = summary["failures"]
    injected = ", ".join(f"{kind} {n}" for kind, n in failures["injected"].items()) or "none"
    table.add_row("failures injected", injected)
    table.add_row("crash/hang detected exactly once", f"{failures['detected_once']} / {failures['to_detect']}")
    if failures["undetected"]:
        table.add_row("[red]not detected (once)[/]", ", ".join(failures["undetected"]))
    if failures["removed_but_should_not_be"]:
        table.add_row("[red]removed but should not be[/]", ", ".join(failures["removed_but_should_not_be"]))
    lateness = summary["detection_lateness_ms"]
    table.add_row("detection lateness p50 / p99 / max (ms)", _triple(lateness))
    table.add_row("  measured from", lateness["source"])
    table.add_row("heartbeats / commits / reconnects",
                  f"{summary['heartbeats']} / {summary['commits']} / {summary['reconnects']}")
    spread = summary.get("members_by_coordinator") or {}
    if len(spread) > 1:  # several coordinator instances
        table.add_row("members by coordinator", ", ".join(f"{address} {n}" for address, n in spread.items()))
    for api, codes in summary["error_codes"].items():
        table.add_row(f"answers: {api}", ", ".join(f"{name} {n}" for name, n in codes.items()))
    unexpected = summary["unexpected_errors"]
    table.add_row("unexpected error codes",
                  "[bold red]" + ", ".join(f"{k} {n}" for k, n in unexpected.items()) + "[/]" if unexpected else "none")
    real = summary.get("real_consumers")
    if real:
        table.add_row("real consumers: records produced", f"{real['produced']} (through {real['bootstrap']})")
        for consumer in real["consumers"]:
            table.add_row(f"  {consumer['name']} ({consumer['client']})",
                          f"{consumer['records']} records, {consumer['rebalances']} rebalances seen"
                          + (f", errors: {'; '.join(consumer['errors'])}" if consumer["errors"] else ""))
    return table


def _triple(values: dict[str, Any]) -> str:
    if not values.get("count"):
        return "n/a"
    return f"{values['p50']} / {values['p99']} / {values['max']}  (n={values['count']})"
