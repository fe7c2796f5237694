"""services: the long-running parts of the compensator besides the API, each built and run by the
composition root (compensator/wiring/, compensator/shell.py) from the one configuration.

    worker/         leases due requests, runs each through its kind's handler, settles it
    projector/      writes the compensation ledger (PostgreSQL) from one set's event log
    kafka/          the Kafka bridges: the store's events out to a topic, failed requests in
    node_metrics.py a store node's Prometheus collector

Why a package of their own, beside `api` and below `compensator`: a service is a part the root
wires, not the root itself, so it takes typed settings and clients and never reads the
configuration, the environment or the command line; and it shares with the API only what sits
below both (the submission rules in `submission`, the request ids and the ledger's vocabulary in
`ledger`, the store's client in `queues`), never the API's own modules.

Must never: import compensator (the root imports the services, not the reverse) or api.
"""
