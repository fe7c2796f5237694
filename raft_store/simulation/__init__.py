"""Seeded, deterministic simulation of a Raft cluster around the production core.

The production `RaftCore` runs unchanged; the network, the disks, the clock and the faults are
simulated and driven by one `random.Random(seed)`, so any failure replays from its seed.
"""
