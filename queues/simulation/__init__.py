"""Seeded, deterministic simulation of the replicated queue (testing.md, layer L1).

The production `RaftCore` and the production `QueueMachine` run on every simulated node; the
network, disks, clocks, clients, workers and the downstream they call are simulated and driven by
one `random.Random(seed)`, so a failing run replays from `python -m queues.simulation --seed N`.
It reuses raft_store's simulated cluster (faults, disks, Raft checker) through its state hooks.
"""
