"""The HTML report: one self-contained file (inline CSS and SVG plots, no script, nothing fetched), built from
the small results the job collects. No pyspark here."""

from __future__ import annotations

import datetime as dt
import html
import math
from dataclasses import dataclass, field
from typing import Any

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7")
ALL = "*"


@dataclass
class ReportData:
    time_range: tuple[int, int]  # epoch ms
    events: int
    skipped: dict[str, int]
    summary: list[dict[str, Any]]  # group_summary rows, "*" first
    reasons: list[dict[str, Any]]
    over_time: list[dict[str, Any]]  # group_id, bucket_start_ms, rebalances
    bucket_ms: int
    durations: list[dict[str, Any]]  # lower_ms, upper_ms, rebalances (all groups)
    failing: list[dict[str, Any]]
    slowest: list[dict[str, Any]]
    member_events: list[dict[str, Any]]
    jaeger_url: str | None = None
    title: str = "Consumer-group rebalances"
    extra: dict[str, Any] = field(default_factory=dict)


def iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def millis(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 60_000:
        return f"{value / 60_000:.1f} min"
    if value >= 1_000:
        return f"{value / 1000:.2f} s"
    return f"{value:.0f} ms"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


# --- plots --------------------------------------------------------------------------------------------------------
WIDTH, HEIGHT = 860, 300
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 16, 44


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1
    step = 10 ** (len(str(int(value))) - 1)
    for factor in (1, 2, 5, 10):
        if value <= factor * step:
            return factor * step
    return 10 * step


def _count_max(value: float) -> int:
    """The top of a count axis: four steps of a whole size (any up to 10, then 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8
    × 10^k), so every tick is a whole number ("0, 3, 6, 9, 12 rebalances", never "1.2, 2.5, 3.8")."""
    needed = max(1.0, value / 4)
    if needed <= 10:
        return 4 * math.ceil(needed)
    scale = 10
    while True:
        for factor in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8):
            if factor * scale >= needed:
                return int(4 * factor * scale)
        scale *= 10


def _y_axis(y_max: float, height: int = HEIGHT) -> list[str]:
    parts = []
    inner = height - TOP - BOTTOM
    for i in range(5):
        value = y_max * i / 4
        y = height - BOTTOM - inner * i / 4
        label = f"{value:g}" if value == int(value) else f"{value:.1f}"
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
                     f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    return parts


def _svg(name: str, title: str, body: list[str], height: int = HEIGHT) -> str:
    return (f'<figure><figcaption>{_e(title)}</figcaption><svg class="plot" data-plot="{name}" role="img" '
            f'aria-label="{_e(title)}" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" '
            f'xmlns="http://www.w3.org/2000/svg">{"".join(body)}</svg></figure>')


def _empty(name: str, title: str, message: str) -> str:
    return _svg(name, title, [f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">'
                              f'{_e(message)}</text>'])


def plot_over_time(data: ReportData) -> str:
    """Stacked bars: rebalances started per time bucket, one colour per group (the busiest groups)."""
    name, title = "rebalances-over-time", f"Rebalances over time per group ({millis(data.bucket_ms)} buckets)"
    if not data.over_time:
        return _empty(name, title, "no rebalances in the range")
    groups = list(dict.fromkeys(row["group_id"] for row in data.over_time))
    start, end = data.time_range
    buckets = max(1, -(-(end - start + 1) // data.bucket_ms))
    stacks: dict[int, list[tuple[str, int]]] = {}
    for row in data.over_time:
        index = min(buckets - 1, max(0, (row["bucket_start_ms"] - start) // data.bucket_ms))
        stacks.setdefault(index, []).append((row["group_id"], row["rebalances"]))
    y_max = _count_max(max(sum(n for _, n in stack) for stack in stacks.values()))
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = inner_w / buckets
    body = _y_axis(y_max)
    for index, stack in sorted(stacks.items()):
        y: float = HEIGHT - BOTTOM
        for group, count in sorted(stack, key=lambda item: groups.index(item[0])):
            h = inner_h * count / y_max
            y -= h
            colour = PALETTE[groups.index(group) % len(PALETTE)]
            body.append(f'<rect class="bar" data-group="{_e(group)}" data-count="{count}" x="{LEFT + index * slot + 1:.1f}" '
                        f'y="{y:.1f}" width="{max(1.0, slot - 2):.1f}" height="{h:.1f}" fill="{colour}">'
                        f'<title>{_e(group)}: {count} at {iso(start + index * data.bucket_ms)}</title></rect>')
    for i in (0, buckets // 2, buckets - 1) if buckets > 2 else (0,):
        body.append(f'<text class="tick" x="{LEFT + (i + 0.5) * slot:.1f}" y="{HEIGHT - BOTTOM + 16}" '
                    f'text-anchor="middle">{iso(start + i * data.bucket_ms)[11:19]}</text>')
    x = LEFT
    for index, group in enumerate(groups):
        body.append(f'<rect class="legend" x="{x}" y="{HEIGHT - 16}" width="10" height="10" '
                    f'fill="{PALETTE[index % len(PALETTE)]}"/><text class="tick" x="{x + 14}" y="{HEIGHT - 7}">'
                    f'{_e(group)}</text>')
        x += 24 + 7 * len(group)
    return _svg(name, title, body)


def plot_durations(data: ReportData) -> str:
    """Histogram of completed rebalance durations (power-of-two buckets), p50/p95 of all groups in the title."""
    overall = next((row for row in data.summary if row["group_id"] == ALL), {})
    name = "duration-distribution"
    title = (f"Rebalance duration (p50 {millis(overall.get('duration_p50_ms'))}, "
             f"p95 {millis(overall.get('duration_p95_ms'))}, max {millis(overall.get('duration_max_ms'))})")
    if not data.durations:
        return _empty(name, title, "no completed rebalances")
    lo = min(row["lower_ms"] for row in data.durations)
    hi = max(row["lower_ms"] for row in data.durations)
    edges = []
    edge = lo
    while edge <= hi:
        edges.append(edge)
        edge *= 2
    counts = {row["lower_ms"]: row["rebalances"] for row in data.durations}
    y_max = _count_max(max(counts.values()))
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = inner_w / len(edges)
    body = _y_axis(y_max)
    for i, lower in enumerate(edges):
        count = counts.get(lower, 0)
        h = inner_h * count / y_max
        body.append(f'<rect class="bar" data-lower-ms="{lower}" data-count="{count}" x="{LEFT + i * slot + 2:.1f}" '
                    f'y="{HEIGHT - BOTTOM - h:.1f}" width="{max(1.0, slot - 4):.1f}" height="{h:.1f}" '
                    f'fill="{PALETTE[0]}"><title>{millis(lower)}–{millis(lower * 2)}: {count}</title></rect>'
                    f'<text class="tick" x="{LEFT + (i + 0.5) * slot:.1f}" y="{HEIGHT - BOTTOM + 16}" '
                    f'text-anchor="middle">≥{millis(lower)}</text>')
    return _svg(name, title, body)


def plot_failures(data: ReportData) -> str:
    """Horizontal bars: the members with the most failures (session expiries and other removals)."""
    name, title = "failures-by-member", "Failures by member (client id @ host, instance id; group)"
    if not data.failing:
        return _empty(name, title, "no member failed")
    bar_h, gap = 22, 6
    height = TOP + len(data.failing) * (bar_h + gap) + 24
    x0 = 330
    x_max = _nice_max(max(row["failures"] for row in data.failing))
    body = []
    for i, row in enumerate(data.failing):
        y = TOP + i * (bar_h + gap)
        w = (WIDTH - x0 - RIGHT - 40) * row["failures"] / x_max
        instance = f" [{row['group_instance_id']}]" if row.get("group_instance_id") else ""
        label = f"{row['client_id']} @ {row['client_host']}{instance} · {row['group_id']}"
        body.append(f'<text class="label" x="{x0 - 8}" y="{y + bar_h - 6}" text-anchor="end">{_e(label[:52])}</text>'
                    f'<rect class="bar" data-group="{_e(row["group_id"])}" data-count="{row["failures"]}" x="{x0}" '
                    f'y="{y}" width="{max(1.0, w):.1f}" height="{bar_h}" fill="{PALETTE[2]}"><title>'
                    f'{_e(", ".join(row.get("reasons") or []))}</title></rect>'
                    f'<text class="tick" x="{x0 + w + 6:.1f}" y="{y + bar_h - 6}">{row["failures"]}</text>')
    return _svg(name, title, body, height)


# --- tables -------------------------------------------------------------------------------------------------------
def _table(name: str, headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    if not rows:
        body = f'<tr><td colspan="{len(headers)}">none</td></tr>'
    return f'<table data-table="{name}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _trace(data: ReportData, trace_id: str | None) -> str:
    if not trace_id:
        return "-"
    if data.jaeger_url:
        return f'<a href="{_e(data.jaeger_url.rstrip("/"))}/trace/{_e(trace_id)}"><code>{_e(trace_id)}</code></a>'
    return f"<code>{_e(trace_id)}</code>"


def _summary_table(data: ReportData) -> str:
    headers = ["group", "rebalances", "per hour", "p50", "p95", "max", "rebalancing", "empty", "joined", "left",
               "failed", "replaced", "generations"]
    rows = [[f"<b>{_e('all groups' if r['group_id'] == ALL else r['group_id'])}</b>", _e(r["rebalances"]),
             f"{r['rebalances_per_hour'] or 0:.1f}", millis(r["duration_p50_ms"]), millis(r["duration_p95_ms"]),
             millis(r["duration_max_ms"]), percent(r["rebalancing_share"]), percent(r["empty_share"]),
             _e(r["joined"]), _e(r["left"]), _e(r["failed"]), _e(r["replaced"]),
             _e(f"{r['first_generation']}→{r['last_generation']}" if r["first_generation"] is not None else "-")]
            for r in data.summary[:100]]
    return _table("group-summary", headers, rows)


def render_html(data: ReportData) -> str:
    overall = next((row for row in data.summary if row["group_id"] == ALL), None) or {}
    groups = sum(1 for row in data.summary if row["group_id"] != ALL)
    skipped = sum(data.skipped.values())
    cards = [("events", f"{data.events:,}"), ("groups", f"{groups:,}"),
             ("rebalances", f"{overall.get('rebalances', 0):,}"),
             ("p95 duration", millis(overall.get("duration_p95_ms"))),
             ("time rebalancing", percent(overall.get("rebalancing_share"))),
             ("members failed", f"{overall.get('failed', 0):,}"), ("records skipped", f"{skipped:,}")]
    reasons = [[_e(r["reason_category"]), _e(r["rebalances"]), f"{r.get('per_hour') or 0:.1f}"]
               for r in data.reasons if r["group_id"] == ALL]
    slowest = [[_e(r["group_id"]), _e(r["status"]), millis(r["duration_ms"]), _e(r["reason_category"]),
                _e(r["generation"]), _e(r["member_count"]), _trace(data, r.get("trace_id"))] for r in data.slowest]
    failing = [[_e(r["group_id"]), _e(r["client_id"]), _e(r["client_host"]), _e(r.get("group_instance_id") or "-"),
                _e(r["failures"]), _e(", ".join(r.get("reasons") or [])), _trace(data, r.get("last_trace_id"))]
               for r in data.failing]
    members = [[_e(r["type"]), _e(r.get("reason") or "-"), _e(r["events"])] for r in data.member_events]
    problems = [[_e(problem), _e(count)] for problem, count in sorted(data.skipped.items())]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(data.title)}</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }}
h1 {{ font-size: 22px; margin: 0 0 4px; }} h2 {{ font-size: 17px; margin: 28px 0 8px; }}
.range {{ color: #666; margin-bottom: 16px; }}
.cards {{ display: flex; flex-wrap: wrap; gap: 10px; }}
.card {{ border: 1px solid #ddd; border-radius: 6px; padding: 8px 14px; min-width: 110px; }}
.card b {{ display: block; font-size: 20px; }} .card span {{ color: #666; font-size: 12px; }}
figure {{ margin: 16px 0; }} figcaption {{ font-weight: 600; margin-bottom: 4px; }}
svg.plot {{ border: 1px solid #eee; background: #fff; max-width: 100%; height: auto; }}
svg .grid {{ stroke: #eee; }} svg .tick, svg .label {{ font-size: 11px; fill: #555; }}
svg .empty {{ fill: #999; font-size: 14px; }}
table {{ border-collapse: collapse; margin: 8px 0; }} td, th {{ border-bottom: 1px solid #eee; padding: 3px 10px;
text-align: right; }} td:first-child, th:first-child {{ text-align: left; }} th {{ background: #f6f6f6; }}
code {{ font-size: 12px; }}
</style></head>
<body>
<h1>{_e(data.title)}</h1>
<div class="range">{iso(data.time_range[0])} — {iso(data.time_range[1])}</div>
<div class="cards">{"".join(f'<div class="card"><b>{_e(v)}</b><span>{_e(k)}</span></div>' for k, v in cards)}</div>
<h2>Rebalances over time</h2>
{plot_over_time(data)}
<h2>How long rebalances take</h2>
{plot_durations(data)}
<h2>Which members fail</h2>
{plot_failures(data)}
<h2>Per group</h2>
{_summary_table(data)}
<h2>Why groups rebalance (all groups)</h2>
{_table("reasons", ["reason", "rebalances", "per hour"], reasons)}
<h2>Membership changes (all groups)</h2>
{_table("member-events", ["event", "reason", "count"], members)}
<h2>Slowest rebalances</h2>
{_table("slowest", ["group", "status", "duration", "reason", "generation", "members", "trace"], slowest)}
<h2>Top failing members</h2>
{_table("failing", ["group", "client id", "host", "instance id", "failures", "reasons", "last trace"], failing)}
<h2>Records skipped</h2>
{_table("skipped", ["problem", "records"], problems)}
</body></html>
"""
