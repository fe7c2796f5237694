"""Errors shared by the command line and the capabilities it runs."""

from __future__ import annotations


class CommandError(Exception):
    """An expected failure with a one-line message for the operator (exit status 1)."""
