"""The shape of the two ledgers the nightly reconciliation reads from other teams: the payment
system's transfers and the red-packet service's grants.

They are not ours (so not in ledger/migrations): this DDL recreates their shape where we stand in
for those systems (the stand-ins, handlers/standins/) and where we generate demo data
(spark_reconcile/synthetic.py), from one definition, so what the stand-ins write is exactly what
the job reads (spark_reconcile/schemas.py declares the columns it reads).

Must never: hold a table of ours.
"""

from __future__ import annotations

from typing import Final


def payment_id_migration(table: str) -> str:
    """A table keyed by the transfer id (before 2026-11) keyed by a payment id, ``pay-<transfer id>``
    for the rows it has: one statement, a no-op once the column exists."""
    return f"""
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
                   AND table_name = '{table}' AND column_name = 'payment_id') THEN
        ALTER TABLE {table} ADD COLUMN payment_id text;
        UPDATE {table} SET payment_id = 'pay-' || transfer_id;
        ALTER TABLE {table} DROP CONSTRAINT {table}_pkey;
        ALTER TABLE {table} ADD PRIMARY KEY (payment_id);
    END IF;
END $$;
"""


PAYMENT_ID_DEFAULT: Final = "('pay-' || gen_random_uuid()::text)"

PAYMENT_TRANSFERS_DDL: Final = (
    f"""
CREATE TABLE IF NOT EXISTS payment_transfers (
    payment_id   text PRIMARY KEY DEFAULT {PAYMENT_ID_DEFAULT},
    transfer_id  text NOT NULL,
    business_id  text,
    payer        text,
    payee        text,
    amount_minor bigint NOT NULL,
    currency     text NOT NULL,
    status       text NOT NULL,
    created_at   timestamptz NOT NULL
);"""
    + payment_id_migration("payment_transfers")
    + f"""
ALTER TABLE payment_transfers ALTER COLUMN payment_id SET DEFAULT {PAYMENT_ID_DEFAULT};
CREATE INDEX IF NOT EXISTS payment_transfers_transfer_id ON payment_transfers (transfer_id);
"""
)
"""A payment is the payment system's, under an id of its own: the caller's transfer id is a column,
unique only where the payment system deduplicates on it, so a transfer paid twice is two rows (the
reconciliation reports it as a duplicate payout). A ledger made when the transfer id was the key
(before 2026-11) gets payment ids ``pay-<transfer id>`` in place."""

RED_PACKET_GRANTS_DDL: Final = """
CREATE TABLE IF NOT EXISTS red_packet_grants (
    grant_id      text PRIMARY KEY,
    red_packet_id text NOT NULL,
    recipient     text NOT NULL,
    amount_minor  bigint NOT NULL,
    currency      text NOT NULL,
    state         text NOT NULL,
    granted_at    timestamptz NOT NULL
);
"""

UPSTREAM_DDL: Final = PAYMENT_TRANSFERS_DDL + RED_PACKET_GRANTS_DDL
