"""The projector (`compensator project`): the compensation ledger in PostgreSQL, written from one
set's committed event log exactly once by event seq (docs/ledger.md).

rows.py folds events into row changes (pure), facts.py reads what the events do not carry,
ledger_writer.py owns the SQL (lock, cursor, one transaction per batch), runner.py the loop.
"""
