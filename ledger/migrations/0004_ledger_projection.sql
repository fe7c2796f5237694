-- What the projector (compensator project) needs to write the compensation ledger from the store's
-- committed events (docs/ledger.md):
-- * request ids are the API's public ids, "{set}-{message id}" (api/ids.py), so the column is text;
--   set_id and message_id keep the two parts for per-set work (a rebuild deletes one set's rows);
-- * an idempotency key may come back as a new request once the store purged the old one's
--   tombstone, so the key is indexed, no longer unique: two requests, two rows;
-- * attempts record the worker, the latency and the lateness, and the queue's two ways an attempt
--   ends without an outcome (handed back on a drain: RELEASED; cut off mid-call: INTERRUPTED);
-- * one cursor per set: the last event seq written, saved in the transaction that writes the rows.

ALTER TABLE compensation_attempts DROP CONSTRAINT compensation_attempts_request_id_fkey;
ALTER TABLE compensation_requests ALTER COLUMN request_id TYPE text USING request_id::text;
ALTER TABLE compensation_attempts ALTER COLUMN request_id TYPE text USING request_id::text;
ALTER TABLE compensation_attempts ADD CONSTRAINT compensation_attempts_request_id_fkey
    FOREIGN KEY (request_id) REFERENCES compensation_requests (request_id) ON DELETE CASCADE;
ALTER TABLE compensation_requests ADD CONSTRAINT compensation_requests_request_id_check CHECK (request_id <> '');

ALTER TABLE compensation_requests DROP CONSTRAINT compensation_requests_idempotency_key_key;
CREATE INDEX compensation_requests_idempotency_key ON compensation_requests (idempotency_key);

ALTER TABLE compensation_requests
    ADD COLUMN set_id        integer CHECK (set_id IS NULL OR set_id >= 1),
    ADD COLUMN message_id    bigint  CHECK (message_id IS NULL OR message_id >= 1),
    ADD COLUMN attempt_count integer NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    ADD COLUMN updated_at    timestamptz,
    ADD COLUMN event_seq     bigint  CHECK (event_seq IS NULL OR event_seq >= 1),  -- the last event applied
    ADD CONSTRAINT compensation_requests_set_message UNIQUE (set_id, message_id);

ALTER TABLE compensation_attempts
    ADD COLUMN worker_id   text,
    ADD COLUMN token       bigint,
    ADD COLUMN latency_ms  bigint CHECK (latency_ms IS NULL OR latency_ms >= 0),
    ADD COLUMN lateness_ms bigint,   -- lease time minus due time, by the store's clock
    ADD CONSTRAINT compensation_attempts_latency CHECK (latency_ms IS NULL OR ended_at IS NOT NULL);

ALTER TABLE compensation_attempts DROP CONSTRAINT compensation_attempts_outcome_check;
ALTER TABLE compensation_attempts ADD CONSTRAINT compensation_attempts_outcome_check CHECK (outcome IN
    ('IN_PROGRESS', 'SUCCEEDED', 'RETRYABLE_ERROR', 'FATAL_ERROR', 'TIMEOUT', 'RELEASED', 'INTERRUPTED'));

CREATE TABLE projector_cursors (
    set_id        integer     PRIMARY KEY CHECK (set_id >= 1),
    last_seq      bigint      NOT NULL CHECK (last_seq >= 0),
    last_event_at timestamptz,             -- the store's timestamp of event last_seq
    updated_at    timestamptz NOT NULL DEFAULT now(),
    owner         text        NOT NULL DEFAULT ''   -- the projector that wrote it last (host:pid)
);
