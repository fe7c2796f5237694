"""The composition root: from one validated `Config` (compensator/config.py) to every process kind
the service runs, one module each, and nothing else builds them.

    api.py        the HTTP API's app (uvicorn runs it: compensator/commands/api.py)
    worker.py     a compensation worker (services/worker/) and the maintenance driver beside it
    projector.py  the ledger projector (services/projector/) and its PostgreSQL
    kafka.py      the events publisher and the Kafka ingest (services/kafka/)
    outbox.py     a producer's outbox relay (outbox/)
    node.py       a store node (raft_store's node running the queue machine) and its metrics
    standins.py   the downstreams' stand-ins (handlers/standins/)
    reconcile.py  the nightly reconciliation's options (spark_reconcile/)
    parts.py      what several kinds build the same way (the clock, a process's name, a metrics address)

Each module turns the configuration into typed settings and concrete parts (store clients, tracer,
metrics, handlers, databases) and hands them to a package that never reads configuration, and
returns what the process shell runs (compensator/shell.py: a `Shell` and a `Running`). The command
line (compensator/*_command.py and friends) only parses flags into configuration overrides and
calls one of these. A module imports only its own kind's stack, so a Kafka process never loads the
web framework and `compensator --help` stays instant.

Must never: run anything at import, or be imported by the packages it wires.
"""
