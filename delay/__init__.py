"""delay: retry policies, as pure decisions.

`policy.decide` turns (policy, attempt, error, now) into the next due time or a dead letter. The
index that finds due messages is the queue's (queues/due_index.py): this package imports neither
queues nor any storage.
"""
