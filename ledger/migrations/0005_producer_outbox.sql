-- Reconciliation proposes its fixes through the producers' outbox (outbox/, docs/outbox.md): our
-- ledger database is a producer like any other, and `compensator outbox-relay` (or the run itself)
-- sends the rows. The table is outbox.schema.ddl() for the default name, checked equal by
-- tests/spark_reconcile/test_reconcile_postgres.py. Rows of the old `outbox` table move over:
-- delivered ones as sent, the rest pending, so nothing proposed is lost.
CREATE TABLE IF NOT EXISTS compensator_outbox (
    id               bigserial   PRIMARY KEY,
    idempotency_key  text        NOT NULL UNIQUE,
    body             jsonb       NOT NULL,
    state            text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'rejected')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    response_status  integer,
    request_id       text,
    problem          jsonb,
    last_error       text,
    CHECK ((state = 'pending') = (finished_at IS NULL))
);
CREATE INDEX IF NOT EXISTS compensator_outbox_due ON compensator_outbox (next_attempt_at, id) WHERE state = 'pending';

INSERT INTO compensator_outbox (idempotency_key, body, state, created_at, finished_at, response_status)
SELECT idempotency_key, jsonb_build_object('kind', kind, 'ref_key', ref_key, 'payload', payload),
       CASE WHEN delivered_at IS NULL THEN 'pending' ELSE 'sent' END, created_at, delivered_at, response_status
FROM outbox ORDER BY created_at, idempotency_key
ON CONFLICT (idempotency_key) DO NOTHING;

DROP TABLE outbox;
