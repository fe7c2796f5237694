-- The compensation ledger records the five states of ledger.states.LedgerState, the ones the queue's
-- six states map to. RESOLVED is not one of them: a dead letter that finance resolves ends SUCCEEDED
-- after its redrive or CANCELLED after a discard, as the queue records it. Which of the two a RESOLVED
-- row was cannot be told from the row, so this migration stops while one exists: a person decides.

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM compensation_requests WHERE state = 'RESOLVED') THEN
        RAISE EXCEPTION 'compensation_requests has RESOLVED rows: set each to SUCCEEDED (redriven) or CANCELLED (discarded), then migrate again';
    END IF;
END
$$;

ALTER TABLE compensation_requests DROP CONSTRAINT compensation_requests_state_check;
ALTER TABLE compensation_requests ADD CONSTRAINT compensation_requests_state_check
    CHECK (state IN ('PENDING', 'IN_FLIGHT', 'SUCCEEDED', 'DEAD_LETTERED', 'CANCELLED'));
