"""submission: what makes a failed request acceptable, for every intake.

    models.py   the body of a submission (one model per kind) and its fields' limits
    rules.py    bytes -> a validated submission, the Idempotency-Key rule, the per-producer key,
                the headers a stored request carries, and the store command that enqueues it

Why a package of its own, below both the HTTP API (api/) and the Kafka ingest (services/kafka/):
a request sent through Kafka and then again over HTTP with the same key must be recognised as the
same request, so both take it through the same rules; and neither may import the other (the ingest
runs without a web framework, the API without Kafka).

Must never: import api, services or compensator, or a web framework.
"""
