"""`compensator demo`'s failures, each one line before anything is submitted (its traffic itself is
run against `compensator run` by tests/spark_reconcile/test_reconcile_local_run.py)."""

from __future__ import annotations

import pytest

from compensator import cli
from raft_store.testing.processes import free_ports


def one_line(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 1) -> str:
    assert cli.main(argv) == code
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    return error


def test_without_a_token_nothing_is_granted(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("COMPENSATOR_API_TOKEN", raising=False)
    assert "no API token: give --token-file, or set $COMPENSATOR_API_TOKEN" in one_line(["demo"], capsys)


def test_a_red_packet_service_that_does_not_answer_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COMPENSATOR_API_TOKEN", "cmp_not-used")
    (port,) = free_ports(1)
    error = one_line(["demo", "--red-packet-url", f"http://127.0.0.1:{port}", "--api-url", "http://127.0.0.1:1"], capsys)
    assert f"the red-packet service at http://127.0.0.1:{port} did not answer" in error


@pytest.mark.parametrize("count", ["0", "1001", "ten"])
def test_a_bad_count_is_refused_by_the_parser(count: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["demo", "--transfers", count])
    assert exited.value.code == 2 and "argument --transfers" in capsys.readouterr().err
