"""The live status line (rich) and the end-of-run summary table."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from coordinator.loadgen.simulation import Progress


def status_text(p: Progress) -> Text:
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


class LiveStatus:
    """A rich Live line on a terminal; elsewhere (CI logs, pipes) a plain line every `every_s` seconds."""

    def __init__(self, console: Console, every_s: float = 5.0) -> None:
        self.console = console
        self.every_s = every_s
        self._live: Live | None = None
        self._last_print = 0.0

    def __enter__(self) -> LiveStatus:
        if self.console.is_terminal:
            self._live = Live(Text("starting…"), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def update(self, progress: Progress) -> None:
        if self._live is not None:
            self._live.update(status_text(progress))
        elif time.monotonic() - self._last_print >= self.every_s:
            self._last_print = time.monotonic()
            self.console.print(status_text(progress), highlight=False)


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
