"""api: the HTTP front door that payment services POST failed requests to.

`create_app(services)` builds the FastAPI application from services the composition root made
(compensator/wiring/api.py): a queue client, a token cache, quota buckets, settings. One router per
resource (requests, refs, kinds, health), RFC 9457 problems for every error, bearer tokens with
roles, quotas that slow before they refuse, OpenTelemetry spans and Prometheus metrics.

Must never: read configuration files or the environment, or reach the store except through
`queues.QueueClient`.
"""
