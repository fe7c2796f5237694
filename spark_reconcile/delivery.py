"""Sending proposed fixes to the compensation API, through the producers' outbox (outbox/).

Owns: adding a run's fixes to the outbox table of our own ledger database in one transaction, and,
when the API's URL and token are given, one relay pass that sends what is due there. The keys are
derived from the discrepancy (spark_reconcile/fixes.py), and adding is idempotent by key, so a
rerun adds nothing it added before, and a fix the API already has is answered as a replay. A key
already in the outbox with another body (a rerun with another ``--payer-account``) is not added
again: it is counted as a conflict for the operator. What the API does not take stays pending for
``compensator outbox-relay`` or the next run; what it refuses is kept as rejected with its problem.

Must never: enqueue without the explicit flag (the pipeline's dry run is the default), or write the
API token anywhere (logs, files, the outbox, error messages, reprs).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Final

import asyncpg

import outbox
from spark_reconcile.fixes import FixRequest

ApiTarget = outbox.ApiTarget
FIXES_MAX: Final = 100_000
RELAY_SETTINGS: Final = outbox.RelaySettings(batch_max=100, concurrency=4)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueResult:
    added: int
    """Fixes new to the outbox in this run."""
    already: int
    """Fixes an earlier run added (the same key and body): nothing new."""
    conflicts: tuple[str, ...]
    """Keys the outbox holds with another body; not added."""
    relayed: outbox.RoundResult | None
    """This run's relay pass, when the API was given."""
    after: outbox.OutboxStatus

    @property
    def complete(self) -> bool:
        """Nothing conflicting, and, when relayed, nothing left pending or rejected."""
        relayed_all = self.relayed is None or (self.after.pending == 0 and self.relayed.rejected == 0)
        return not self.conflicts and relayed_all


async def enqueue_async(dsn: str, fixes: list[FixRequest], *, api: ApiTarget | None) -> EnqueueResult:
    if len(fixes) > FIXES_MAX:
        raise ValueError(f"refusing to enqueue more than {FIXES_MAX} fixes in one run")
    added = already = 0
    conflicts: list[str] = []
    connection = await asyncpg.connect(dsn)
    try:
        async with connection.transaction():
            for fix in fixes:
                try:
                    if await outbox.add(connection, outbox.OutboxRequest(key=fix.idempotency_key, body=fix.body())):
                        added += 1
                    else:
                        already += 1
                except outbox.OutboxConflict:
                    conflicts.append(fix.idempotency_key)
    finally:
        await connection.close()
    relayed = None
    async with asyncpg.create_pool(dsn, min_size=1, max_size=2) as pool:
        if api is not None:
            async with outbox.Relay(pool, api, RELAY_SETTINGS) as relay:
                relayed = await relay.drain()
        async with pool.acquire() as connection:
            after = await outbox.status(connection)
    return EnqueueResult(added=added, already=already, conflicts=tuple(conflicts), relayed=relayed, after=after)


def enqueue(dsn: str, fixes: list[FixRequest], *, api: ApiTarget | None) -> EnqueueResult:
    return asyncio.run(enqueue_async(dsn, fixes, api=api))
