"""The compensation worker (``compensator worker``): leases due requests, runs each through its
kind's handler, and acks, fails or hands back what it leased; run as many as you like, anywhere.

    limits.py       how many attempts may run at once, per kind and per downstream
    shares.py       that room shared fairly by the sets the worker leases from
    lanes.py        one set's loop: wait, lease, its own completions, keeper and backoff
    breaker.py      one downstream's circuit breaker; breaker_board.py all of them, over every set
    documents.py    operators' documents (breaker modes, classification tables)
    completions.py  acks, fails and releases, batched into one store frame each flush
    keeper.py       lease extension while a handler runs
    runner.py       the loop: wait for work with reads, lease, attempt, drain on SIGTERM

Must never: write to the store while idle (waiting for work is a read), or decide a retry delay
(the kind's policy in the store does; a handler only classifies).
"""
