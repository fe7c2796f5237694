"""The finance report: one self-contained HTML file with inline SVG charts.

Owns: presentation only. No scripts, fonts or stylesheets are fetched, so the file opens offline
and can be mailed or archived as is. Amounts are shown in major units using each currency's minor
unit exponent; the underlying numbers stay integers.

Must never: compute a result; everything shown comes from the summary and the listed rows.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any, Final

from spark_reconcile.schemas import DiscrepancyClass
from spark_reconcile.summary import RunSummary, TrendPoint

_ZERO_DECIMAL_CURRENCIES: Final = frozenset({"JPY", "KRW", "VND", "CLP", "ISK", "UGX"})
_PALETTE: Final = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f")
_LABELS: Final = {
    DiscrepancyClass.MISSING_IN_PAYMENT.value: "Granted, never paid",
    DiscrepancyClass.MISSING_IN_RED_PACKET.value: "Paid, never granted",
    DiscrepancyClass.AMOUNT_MISMATCH.value: "Amount or currency mismatch",
    DiscrepancyClass.DUPLICATE_PAYOUT.value: "Duplicate payout",
    DiscrepancyClass.COMPENSATED_NOT_PAID.value: "Compensated, not in payment ledger",
    DiscrepancyClass.PENDING_PAST_SLA.value: "Pending past SLA",
    DiscrepancyClass.DEAD_LETTERED.value: "Dead-lettered, unresolved",
}
_LISTED_COLUMNS: Final = (
    "discrepancy_class",
    "business_id",
    "transfer_id",
    "request_id",
    "recipient",
    "currency",
    "amount_minor",
    "expected_amount_minor",
    "actual_amount_minor",
    "expected_currency",
    "actual_currency",
    "occurred_at",
)


def money(amount_minor: int | None, currency: str | None) -> str:
    if amount_minor is None:
        return ""
    code = currency or ""
    if code in _ZERO_DECIMAL_CURRENCIES:
        return f"{amount_minor:,} {code}".strip()
    sign = "-" if amount_minor < 0 else ""
    whole, cents = divmod(abs(amount_minor), 100)
    return f"{sign}{whole:,}.{cents:02d} {code}".strip()


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def bar_chart(title: str, values: Mapping[str, float], *, value_label: Mapping[str, str] | None = None) -> str:
    """Horizontal bars, one per key; labels carry the exact figures so the chart is never the only copy."""
    width, label_w, row_h = 640, 260, 24
    height = row_h * max(1, len(values)) + 30
    top = max([abs(v) for v in values.values()] + [1.0])
    parts = [
        f'<svg role="img" aria-label="{_e(title)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="0" y="14" font-size="13" font-weight="bold">{_e(title)}</text>',
    ]
    for index, (name, value) in enumerate(values.items()):
        y = 24 + index * row_h
        bar = int((width - label_w - 120) * abs(value) / top)
        shown = (value_label or {}).get(name, f"{value:,.0f}")
        parts.append(f'<text x="0" y="{y + 15}" font-size="12">{_e(_LABELS.get(name, name))}</text>')
        parts.append(
            f'<rect x="{label_w}" y="{y + 3}" width="{bar}" height="{row_h - 8}" '
            f'fill="{_PALETTE[index % len(_PALETTE)]}"/>'
        )
        parts.append(f'<text x="{label_w + bar + 6}" y="{y + 15}" font-size="12">{_e(shown)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def trend_chart(points: Sequence[TrendPoint]) -> str:
    """Lines per class over recent runs (counts); an empty history is said, not drawn."""
    if len(points) < 2:
        return "<p>Not enough runs yet for a trend (need two or more).</p>"
    width, height, left, bottom = 720, 260, 50, 40
    classes = [c.value for c in DiscrepancyClass]
    top = max([max(p.counts.values(), default=0) for p in points] + [1])
    step = (width - left - 20) / (len(points) - 1)

    def xy(index: int, value: int) -> str:
        return f"{left + index * step:.1f},{height - bottom - (height - bottom - 20) * value / top:.1f}"

    parts = [
        f'<svg role="img" aria-label="Discrepancies per run" width="{width}" height="{height + 20 * 4}" '
        f'xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - 10}" y2="{height - bottom}" stroke="#999"/>',
        f'<text x="0" y="24" font-size="11">{top:,}</text>',
        f'<text x="0" y="{height - bottom}" font-size="11">0</text>',
    ]
    for index, point in enumerate(points):
        if index in (0, len(points) - 1) or len(points) <= 10:
            parts.append(
                f'<text x="{left + index * step - 30:.1f}" y="{height - bottom + 16}" font-size="10">'
                f"{point.business_date.isoformat()}</text>"
            )
    for number, name in enumerate(classes):
        colour = _PALETTE[number % len(_PALETTE)]
        line = " ".join(xy(i, p.counts.get(name, 0)) for i, p in enumerate(points))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{line}"/>')
        legend_y = height + 4 + (number // 2) * 18
        legend_x = left + (number % 2) * 330
        parts.append(
            f'<rect x="{legend_x}" y="{legend_y}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{legend_x + 14}" y="{legend_y + 10}" font-size="11">{_e(_LABELS[name])}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _class_table(summary: RunSummary) -> str:
    counts, amounts = summary.counts(), summary.amounts()

    def shown(name: str) -> str:
        return "<br>".join(_e(money(v, c)) for c, v in sorted(amounts[name].items())) or "-"

    rows = "".join(
        f"<tr><td>{_e(_LABELS[name])}</td><td class=n>{counts[name]:,}</td><td class=n>{shown(name)}</td></tr>"
        for name in counts
    )
    return f"<table><tr><th>Class</th><th>Count</th><th>Amount at stake</th></tr>{rows}</table>"


def _totals_table(summary: RunSummary) -> str:
    totals, net = summary.day_totals(), summary.net_difference()
    currencies = sorted({c for per in totals.values() for c in per} | set(net))
    head = "".join(f"<th>{_e(c)}</th>" for c in currencies)
    body = ""
    for ledger, per in totals.items():
        cells = "".join(
            f"<td class=n>{per[c]['count']:,} / {_e(money(per[c]['amount_minor'], c))}</td>"
            if c in per
            else "<td>-</td>"
            for c in currencies
        )
        body += f"<tr><td>{_e(ledger)}</td>{cells}</tr>"
    net_cells = "".join(f"<td class=n><b>{_e(money(net.get(c, 0), c))}</b></td>" for c in currencies)
    body += f"<tr><td><b>Net difference (paid - granted)</b></td>{net_cells}</tr>"
    return f"<table><tr><th>Ledger (count / amount)</th>{head}</tr>{body}</table>"


def _listing(rows: Sequence[Mapping[str, Any]], total: int, parquet_uri: str) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in _LISTED_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{_e(row.get(c))}</td>" for c in _LISTED_COLUMNS) + "</tr>" for row in rows)
    note = (
        f"All {total:,} discrepancies are listed below."
        if len(rows) >= total
        else f"The {len(rows):,} largest of {total:,} discrepancies are listed; the full list is in "
        f"<code>{_e(parquet_uri)}</code>."
    )
    return f"<p>{note}</p><table class=list><tr>{head}</tr>{body}</table>"


def render(
    summary: RunSummary,
    *,
    listing: Sequence[Mapping[str, Any]],
    trend: Sequence[TrendPoint],
    parquet_uri: str,
) -> str:
    counts = summary.counts()
    total = sum(counts.values())
    currencies = sorted({c for per in summary.amounts().values() for c in per})
    amount_charts = "".join(
        bar_chart(
            f"Amount at stake, {currency}",
            {name: float(per.get(currency, 0)) for name, per in summary.amounts().items()},
            value_label={name: money(per.get(currency, 0), currency) for name, per in summary.amounts().items()},
        )
        for currency in currencies
    )
    history = [*trend, _point(summary)]
    refused = (
        f" ({summary.fixes_refused:,} refused: no valid transfer, see the missing_in_payment rows)"
        if summary.fixes_refused
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Ledger reconciliation {summary.business_date.isoformat()}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; margin: 8px 0 20px; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; font-size: 13px; text-align: left; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
table.list td {{ font-size: 11px; }}
.ok {{ color: #2e7d32; }} .bad {{ color: #c62828; }}
</style></head><body>
<h1>Ledger reconciliation, business date {summary.business_date.isoformat()}</h1>
<p class="{"bad" if total else "ok"}"><b>{total:,} discrepancies</b>
 &middot; run {_e(summary.run_id)} &middot; {summary.duration_ms / 1000:.1f} s
 &middot; source {_e(summary.source)}</p>
<p>Input rows: {_e(", ".join(f"{k} {v:,}" for k, v in summary.input_rows().items()))}.
 Late window {summary.parameters.get("late_window_s", 0) / 3600:g} h, pending SLA
 {summary.parameters.get("pending_sla_s", 0) / 3600:g} h. Fixes proposed: {summary.fixes_proposed:,}{refused}.</p>
<h2>By class</h2>
{_class_table(summary)}
{bar_chart("Discrepancies per class", {k: float(v) for k, v in counts.items()})}
{amount_charts}
<h2>Ledger totals for the day</h2>
{_totals_table(summary)}
<h2>Trend over recent runs</h2>
{trend_chart(history)}
<h2>Discrepancies</h2>
{_listing(listing, total, parquet_uri)}
</body></html>
"""


def _point(summary: RunSummary) -> TrendPoint:
    return TrendPoint(business_date=summary.business_date, counts=summary.counts())
