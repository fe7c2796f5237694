"""Helpers to run real multi-process clusters on loopback (process tests and benchmarks)."""
