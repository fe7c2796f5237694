"""The local run's own traffic, reconciled as the README says: `compensator run` on free ports, the
banner's commands run as printed (the red packet's grant, its failed transfer, `compensator demo`
for a red packet of ten receivers), every request paid by a worker and projected into the
compensation ledger, then `compensator reconcile --date <today> --pg-data <the run's>`: no
discrepancy, because every payout pays a red packet the red-packet stand-in granted.

Then two breaks are planted into the local ledgers, and the next run finds exactly those: a payout
nobody granted, made straight at the payment stand-in (the README's example), and a payout whose
amount was changed in the payment ledger behind everyone's back.

The launcher is the browser tests' (tests/web/browser_support.py); the Spark session is this
folder's, which the reconcile command reuses in-process.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from browser_support import ROOT, Banner, LocalRun, child_env, local_run, poll_until
from pyspark.sql import SparkSession

from compensator import cli
from ledger import pg

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.usefixtures("jdbc_driver")]

PAID_TIMEOUT_S = 60.0


def printed(banner: Banner, marker: str) -> str:
    """The banner's first `curl` whose first line holds `marker`, with its continuation lines."""
    lines = [line.strip() for line in banner.lines]
    first = next(i for i, line in enumerate(lines) if line.startswith("curl ") and marker in line)
    last = next(i for i in range(first, len(lines)) if not lines[i].endswith("\\"))
    return "\n".join(lines[first : last + 1])


def shell(command: str) -> dict[str, Any]:
    """A printed curl, run as a person pastes it; the JSON body it answered."""
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    body: dict[str, Any] = json.loads(done.stdout.rsplit("\n\n", 1)[-1].replace("\r", ""))
    return body


def demo(run: LocalRun, banner: Banner) -> list[str]:
    """The banner's `compensator demo` line, run with this checkout's code; the request ids it printed."""
    line = next(line.strip() for line in banner.lines if " demo --transfers " in line)
    assignment, _program, *arguments = shlex.split(line)
    name, _, token = assignment.partition("=")
    done = subprocess.run(
        [sys.executable, "-m", "compensator", *arguments], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env=child_env({**run.env, name: token}),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return re.findall(r"request (\S+)", done.stdout)


def wait_paid(banner: Banner, ids: list[str]) -> None:
    headers = {"Authorization": f"Bearer {banner.operator_token}"}
    with httpx.Client(base_url=banner.api_url, headers=headers, timeout=30.0) as client:
        for request_id in ids:
            poll_until(lambda: client.get(f"/v1/requests/{request_id}").json()["state"] == "done",  # noqa: B023
                       timeout_s=PAID_TIMEOUT_S, what=f"{request_id} paid")  # fmt: skip


def ledger_dsn(run: LocalRun) -> str:
    """The run's PostgreSQL (its port, from postmaster.pid, and its generated password); the launcher stops it."""
    dsn = pg.EmbeddedPostgres(run.data_dir / "pg" / "data").running_dsn()
    assert dsn is not None, "the local run's PostgreSQL is not running"
    return dsn


def fetch(dsn: str, query: str, *args: object) -> list[asyncpg.Record]:
    async def go() -> list[asyncpg.Record]:
        connection = await asyncpg.connect(dsn)
        try:
            return list(await connection.fetch(query, *args))
        finally:
            await connection.close()

    return asyncio.run(go())


def reconcile(run: LocalRun, output: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The README's command, in this process (it keeps the tests' Spark session): its JSON summary."""
    capsys.readouterr()
    argv = ["reconcile", "--date", dt.datetime.now(dt.UTC).date().isoformat(), "--pg-data",
            str(run.data_dir / "pg" / "data"), "--output-dir", str(output), "--json", "--shuffle-partitions", "2"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    summary: dict[str, Any] = json.loads(capsys.readouterr().out)
    return summary


def listed(output: Path) -> list[tuple[str, str]]:
    import pyarrow.parquet as pq

    day = dt.datetime.now(dt.UTC).date().isoformat()
    table = pq.read_table(output / f"date={day}" / "discrepancies")
    return sorted((row["discrepancy_class"], row["business_id"]) for row in table.to_pylist())


def test_the_local_runs_traffic_reconciles_clean_and_a_planted_break_is_found(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    with local_run() as (run, banner):
        up_s = time.monotonic() - began
        granted = shell(printed(banner, "/red-packets/"))
        assert granted == {"applied": True, "version": 1, "repeat": False}
        submitted = shell(printed(banner, " -X POST "))
        ids = [submitted["id"], *demo(run, banner)]
        assert len(ids) == 11
        wait_paid(banner, ids)
        dsn = ledger_dsn(run)
        poll_until(lambda: fetch(dsn, "SELECT count(*) AS n FROM compensation_requests WHERE state = 'SUCCEEDED'"
                                 " AND request_id = ANY($1::text[])", ids)[0]["n"] == len(ids),
                   timeout_s=30.0, what="the projector wrote every request SUCCEEDED")  # fmt: skip
        grants = fetch(dsn, "SELECT grant_id FROM red_packet_grants ORDER BY grant_id")
        assert {row["grant_id"] for row in grants} >= {submitted["ref_key"]} and len(grants) == 11

        paid_s = time.monotonic() - began
        clean = reconcile(run, tmp_path / "clean", capsys)
        assert clean["discrepancies"] == 0, clean["classes"]
        assert clean["input_rows"] == {"compensation_requests": 11, "payment_transfers": 11, "red_packet_grants": 11}
        assert listed(tmp_path / "clean") == []

        stray = {"transfer_id": "tr-stray-1", "business_id": "rp-stray:user-9", "payer": "red-packet-escrow",
                 "payee": "user-9", "amount_minor": 500, "currency": "CNY"}  # fmt: skip
        paid = httpx.post(f"{banner.payment_url}/transfers", json=stray, headers={"Idempotency-Key": "tr-stray-1"})
        assert paid.status_code == 201, paid.text
        changed = submitted["ref_key"]
        fetch(dsn, "UPDATE payment_transfers SET amount_minor = amount_minor + 1 WHERE business_id = $1", changed)

        broken = reconcile(run, tmp_path / "broken", capsys)
        reconciled_s = time.monotonic() - began
    counted = {name: found["count"] for name, found in broken["classes"].items() if found["count"]}
    assert counted == {"missing_in_red_packet": 1, "amount_or_currency_mismatch": 1}
    assert listed(tmp_path / "broken") == [("amount_or_currency_mismatch", changed),
                                           ("missing_in_red_packet", "rp-stray:user-9")]  # fmt: skip
    print(f"\nlocal run up in {up_s:.1f} s, its traffic paid and projected at {paid_s:.1f} s, reconciled twice"
          f" by {reconciled_s:.1f} s ({clean['duration_ms'] / 1000:.1f} s and {broken['duration_ms'] / 1000:.1f} s)")
