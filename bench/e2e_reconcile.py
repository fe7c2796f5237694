"""The end-to-end benchmark's closing reconciliation: `compensator reconcile` on the run's ledgers
as the run left them, then on the same ledgers with four breaks planted that it must report.

Must never: plant a break into a ledger before the run's own reconciliation has read it.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench.harness import BenchError, child_environment, compensator_command


async def plant_breaks(dsn: str) -> dict[str, str]:
    """Breaks the reconciliation must find, written into the stand-ins' ledgers after the run, as
    a misbehaving payment system would: two payouts of one grant, a payout of the wrong amount, a
    grant never paid, and a payout of no grant. Returns the business id planted for each class."""
    connection = await asyncpg.connect(dsn)
    try:
        grants = await connection.fetch(
            "SELECT g.grant_id, g.amount_minor, g.currency FROM red_packet_grants g WHERE NOT EXISTS"
            " (SELECT 1 FROM payment_transfers t WHERE t.business_id = g.grant_id) ORDER BY g.grant_id LIMIT 2")
        if len(grants) < 2:
            raise BenchError("the run left fewer than two unpaid grants to plant breaks on")
        paid_twice, wrong_amount = grants
        async with connection.transaction():
            insert = ("INSERT INTO payment_transfers (transfer_id, business_id, payer, payee, amount_minor, currency,"
                      " status, created_at) VALUES ($1, $2, 'planted', 'planted', $3, $4, 'SUCCEEDED', now())")  # fmt: skip
            for n in (1, 2):
                await connection.execute(insert, f"planted-twice-{n}", paid_twice["grant_id"], paid_twice["amount_minor"],
                                         paid_twice["currency"])  # fmt: skip
            await connection.execute(insert, "planted-amount", wrong_amount["grant_id"], wrong_amount["amount_minor"] + 1,
                                     wrong_amount["currency"])  # fmt: skip
            await connection.execute(insert, "planted-orphan", "planted-no-grant", 500, "CNY")
            await connection.execute(
                "INSERT INTO red_packet_grants (grant_id, red_packet_id, recipient, amount_minor, currency, state,"
                " granted_at) VALUES ('planted-unpaid', 'planted', 'planted', 700, 'CNY', 'GRANTED', now())")
    finally:
        await connection.close()
    return {"duplicate_payout": paid_twice["grant_id"], "amount_or_currency_mismatch": wrong_amount["grant_id"],
            "missing_in_payment": "planted-unpaid", "missing_in_red_packet": "planted-no-grant"}  # fmt: skip


def reconcile_today(dsn: str, output: Path, planted: dict[str, str]) -> dict[str, Any]:
    """`compensator reconcile` for today (UTC) on the run's three ledgers in `dsn`, its files in
    `output`: its count per class, and whether each planted break was reported, under its class."""
    day = time.strftime("%Y-%m-%d", time.gmtime())
    done = subprocess.run(
        [*compensator_command(), "reconcile", "--date", day, "--output-dir", str(output)],
        env=child_environment(COMPENSATOR_PG_DSN=dsn), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    summary = json.loads((output / f"date={day}" / "summary.json").read_text())
    import pyarrow.parquet as pq

    found = pq.read_table(output / f"date={day}" / "discrepancies", columns=["discrepancy_class", "business_id"])
    reported = set(zip(found.column("discrepancy_class").to_pylist(), found.column("business_id").to_pylist(), strict=True))
    return {
        "counts": {name: counts["count"] for name, counts in summary["classes"].items()},
        "planted_found": {name: (name, business_id) in reported for name, business_id in planted.items()},
    }
