-- One set's projection stopped by what needs a person (a gap in its log, a ledger that disagrees
-- with it): the projector keeps the other sets going and records here why this one stopped and
-- where (its cursor did not move), so `compensator status` shows it (docs/ledger.md, "One set
-- stopped"). Cleared when a projector projects the set again (after a restart or a rebuild).

ALTER TABLE projector_cursors
    ADD COLUMN stopped_at     timestamptz,
    ADD COLUMN stopped_reason text,
    ADD CONSTRAINT projector_cursors_stopped CHECK ((stopped_at IS NULL) = (stopped_reason IS NULL));
