"""The producers' outbox: hand a compensation request to the service inside your own transaction.

    import outbox

    async with connection.transaction():
        await connection.execute("UPDATE grants SET state = 'failed' WHERE ...")
        await outbox.add(connection, outbox.OutboxRequest.of(
            key="grant-123-transfer", kind="transfer", ref_key="grant-123", payload={...}))

The row commits or rolls back with the producer's own change, so a failure that happened is never
forgotten, even when the compensation API is unreachable at that moment. A relay (``compensator
outbox-relay``, or :class:`Relay` inside the producer) POSTs pending rows with their idempotency
keys and marks them sent: at least once, with an exactly-once effect because the API deduplicates
on the key. docs/outbox.md has the table, the relay's answers to each status and its metrics.

Must never: import the service's own packages (api, queues, compensator, ...): a producer installs
this and talks to the service over HTTP only.
"""

from outbox.metrics import RelayMetrics
from outbox.relay import ApiTarget, Relay, RelaySettings, RoundResult
from outbox.rows import OutboxConflict, OutboxRequest, OutboxStatus, add, status
from outbox.schema import DEFAULT_TABLE, install

__all__ = [
    "DEFAULT_TABLE",
    "ApiTarget",
    "OutboxConflict",
    "OutboxRequest",
    "OutboxStatus",
    "Relay",
    "RelayMetrics",
    "RelaySettings",
    "RoundResult",
    "add",
    "install",
    "status",
]
