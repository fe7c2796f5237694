"""queues: the compensation queue as a deterministic replicated state machine, and its client.

The public names are exported here; the modules say what they own. Callers outside this package
(the API, the workers, the command line) use `QueueClient` and these values, and the errors a
store call can end with: `QueueError` (the machine refused the command's values) and
`ClientError` from raft_store (no definitive answer: see its subclasses).
"""

from queues.client import EventsPurged, QueueClient, QueueError, Read
from queues.machine import QueueConfig, QueueMachine
from queues.model import (
    BUILTIN_KINDS,
    PAYLOAD_BYTES_MAX,
    TIME_MS_MAX,
    AttemptView,
    AuditEntry,
    Code,
    DeadLetterFilter,
    DeadLetterSummary,
    Discard,
    EditRedrive,
    Enqueue,
    EnqueueResult,
    Event,
    EventType,
    Grant,
    KindResult,
    LeaseResult,
    MessageView,
    Outcome,
    ProposalState,
    ProposalView,
    Redrive,
    ReviewAction,
    ReviewResult,
    Role,
    State,
    TokenResult,
    TokenView,
)
from queues.proposals import proposal_action
from queues.query_codec import KindView, PauseView
from raft_store.client import ClientError, OutcomeUnknown, RaftClient, Unavailable

__all__ = [
    "BUILTIN_KINDS",
    "PAYLOAD_BYTES_MAX",
    "TIME_MS_MAX",
    "AttemptView",
    "AuditEntry",
    "ClientError",
    "Code",
    "DeadLetterFilter",
    "DeadLetterSummary",
    "Discard",
    "EditRedrive",
    "Enqueue",
    "EnqueueResult",
    "Event",
    "EventType",
    "EventsPurged",
    "Grant",
    "KindResult",
    "KindView",
    "LeaseResult",
    "MessageView",
    "Outcome",
    "OutcomeUnknown",
    "PauseView",
    "ProposalState",
    "ProposalView",
    "QueueClient",
    "QueueConfig",
    "QueueError",
    "QueueMachine",
    "RaftClient",
    "Read",
    "Redrive",
    "ReviewAction",
    "ReviewResult",
    "Role",
    "State",
    "TokenResult",
    "TokenView",
    "Unavailable",
    "proposal_action",
]
