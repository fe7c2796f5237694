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

PAYMENT_TRANSFERS_DDL: Final = """
CREATE TABLE IF NOT EXISTS payment_transfers (
    transfer_id  text PRIMARY KEY,
    business_id  text,
    payer        text,
    payee        text,
    amount_minor bigint NOT NULL,
    currency     text NOT NULL,
    status       text NOT NULL,
    created_at   timestamptz NOT NULL
);
"""

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
