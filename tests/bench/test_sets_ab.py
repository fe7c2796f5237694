"""bench.sets_ab refuses what it cannot run in one line, before it starts a node."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import sets_ab


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--checkout", "main"], "want NAME=PATH"),
        (["--checkout", "=."], "want NAME=PATH"),
        (["--checkout", "main=/nonexistent-checkout"], "PATH/raft_store must exist"),
        (["--rate", "0"], "must be positive"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the default checkout: this one
    with pytest.raises(SystemExit) as stopped:
        sets_ab.main(argv)
    assert stopped.value.code == 2
    assert says in capsys.readouterr().err
