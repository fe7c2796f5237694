"""raft_store: a Raft-replicated durable log.

Layers, innermost first: `core` (pure Raft, no I/O), `wal` and `snapshots` (framed, checksummed,
fsynced files), `codec` and `transport` (binary frames over asyncio TCP, opened by the cluster
secret's `handshake`, with `auth` the secrets and TLS files), `node` (drives them all
and feeds committed commands to a `StateMachine`), `client` (leader discovery and exactly-once
sessions). This package imports none of the service's other packages.
"""
