-- Results of the nightly ledger reconciliation, read by the API and the review page.
-- One current run per business date: a rerun replaces the date's rows in one transaction.

CREATE TABLE reconciliation_runs (
    run_id           uuid PRIMARY KEY,
    business_date    date        NOT NULL UNIQUE,
    started_at       timestamptz NOT NULL,
    finished_at      timestamptz NOT NULL,
    duration_ms      bigint      NOT NULL CHECK (duration_ms >= 0),
    discrepancies    bigint      NOT NULL CHECK (discrepancies >= 0),
    input_rows       jsonb       NOT NULL,   -- {"payment_transfers": n, ...}: rows read per ledger
    output_uri       text        NOT NULL,   -- where the discrepancy Parquet and report live
    parameters       jsonb       NOT NULL    -- late window, SLA, source: what produced these numbers
);

CREATE TABLE reconciliation_class_totals (
    run_id              uuid   NOT NULL REFERENCES reconciliation_runs (run_id) ON DELETE CASCADE,
    discrepancy_class   text   NOT NULL,
    currency            text   NOT NULL,
    discrepancy_count   bigint NOT NULL CHECK (discrepancy_count >= 0),
    amount_minor        bigint NOT NULL,
    PRIMARY KEY (run_id, discrepancy_class, currency)
);

CREATE TABLE reconciliation_ledger_totals (
    run_id        uuid   NOT NULL REFERENCES reconciliation_runs (run_id) ON DELETE CASCADE,
    ledger        text   NOT NULL,
    currency      text   NOT NULL,
    row_count     bigint NOT NULL CHECK (row_count >= 0),
    amount_minor  bigint NOT NULL,
    PRIMARY KEY (run_id, ledger, currency)
);

-- Compensation requests proposed by reconciliation; the idempotency key is derived from the
-- discrepancy, so a rerun inserts nothing new and the API dedupes what was already sent.
CREATE TABLE outbox (
    idempotency_key text PRIMARY KEY,
    kind            text        NOT NULL,
    ref_key         text        NOT NULL,
    payload         jsonb       NOT NULL,
    source          text        NOT NULL,   -- e.g. 'reconciliation:2026-11-20'
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    response_status integer
);
