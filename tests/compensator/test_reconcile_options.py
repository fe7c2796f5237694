"""`compensator reconcile` reads the ledger the projector writes unless told otherwise: the job's
options are filled from the one configuration (compensator/wiring/reconcile.py), its own flags and
`$COMPENSATOR_PG_DATA` first."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from compensator.config import load
from compensator.wiring.reconcile import options


def test_the_ledger_reconciled_is_the_projectors_unless_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPENSATOR_PG_DATA", raising=False)
    config = load(None, {"COMPENSATOR_PROJECTOR__PG_DATA": "/srv/ledger/pg"})
    assert options(argparse.Namespace(pg_data=None), config).pg_data == Path("/srv/ledger/pg")
    assert options(argparse.Namespace(pg_data=Path("other")), config).pg_data == Path("other")
    monkeypatch.setenv("COMPENSATOR_PG_DATA", "/from/env")
    assert options(argparse.Namespace(pg_data=None), config).pg_data is None  # the job reads the variable
