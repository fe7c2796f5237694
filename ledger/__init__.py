"""ledger: the service's shared vocabulary and its PostgreSQL.

What a compensation request *is* (its kinds, their payload schemas, amounts in integer minor units
of an ISO 4217 currency) and what the compensation ledger records about it (its states, and how the
queue's states map to them) are defined here once and imported by the API, the workers, the
projector and the reconciliation. The PostgreSQL helper and the schema migrations live here too,
so that the composition root (compensator) and the nightly job (spark_reconcile) share them
without importing each other.

Must never: import the API, the workers, compensator or spark_reconcile.
"""
