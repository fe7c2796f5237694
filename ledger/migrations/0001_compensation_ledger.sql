-- The compensation ledger: the service's own record of every request and every attempt.
-- Filled later by the projection from the store; the nightly reconciliation reads it.
-- Invariants live here, next to the data: amounts are integers in minor units, a terminal
-- request has a finish time and an open one does not.

CREATE TABLE compensation_requests (
    request_id      uuid PRIMARY KEY,
    kind            text        NOT NULL CHECK (kind <> ''),
    idempotency_key text        NOT NULL UNIQUE,
    ref_key         text        NOT NULL,              -- business id, e.g. the red-packet grant id
    amount_minor    bigint      CHECK (amount_minor IS NULL OR amount_minor >= 0),
    currency        text        CHECK (currency IS NULL OR currency ~ '^[A-Z]{3}$'),
    state           text        NOT NULL CHECK (state IN
                        ('PENDING', 'IN_FLIGHT', 'SUCCEEDED', 'DEAD_LETTERED', 'RESOLVED', 'CANCELLED')),
    created_at      timestamptz NOT NULL,
    finished_at     timestamptz,
    CHECK ((amount_minor IS NULL) = (currency IS NULL)),
    CHECK ((state IN ('PENDING', 'IN_FLIGHT')) = (finished_at IS NULL)),
    CHECK (finished_at IS NULL OR finished_at >= created_at)
);

CREATE INDEX compensation_requests_ref_key ON compensation_requests (ref_key);
CREATE INDEX compensation_requests_created_at ON compensation_requests (created_at);
CREATE INDEX compensation_requests_open ON compensation_requests (created_at)
    WHERE state IN ('PENDING', 'IN_FLIGHT', 'DEAD_LETTERED');

CREATE TABLE compensation_attempts (
    request_id        uuid        NOT NULL REFERENCES compensation_requests (request_id) ON DELETE CASCADE,
    attempt_number    integer     NOT NULL CHECK (attempt_number >= 1),
    started_at        timestamptz NOT NULL,
    ended_at          timestamptz,
    outcome           text        NOT NULL CHECK (outcome IN
                          ('IN_PROGRESS', 'SUCCEEDED', 'RETRYABLE_ERROR', 'FATAL_ERROR', 'TIMEOUT')),
    error_class       text,
    downstream_status integer     CHECK (downstream_status IS NULL OR downstream_status BETWEEN 100 AND 599),
    PRIMARY KEY (request_id, attempt_number),
    CHECK ((outcome = 'IN_PROGRESS') = (ended_at IS NULL)),
    CHECK (ended_at IS NULL OR ended_at >= started_at)
);
