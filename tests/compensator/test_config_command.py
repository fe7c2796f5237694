"""`compensator config`: check answers in one line per problem, show round-trips, and the reference
in docs/ is the one generated from the model, every setting with a meaning."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from compensator import cli
from compensator import config as configuration
from compensator.commands.config import reference

ROOT = Path(__file__).resolve().parents[2]


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    for name in [name for name in os.environ if name.startswith(configuration.ENV_PREFIX)]:
        monkeypatch.delenv(name)
    code = cli.main(["config", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_reference_in_docs_is_generated_from_the_model() -> None:
    written = (ROOT / "docs" / "configuration.md").read_text()
    assert written == reference(), (
        "docs/configuration.md is stale: run `compensator config docs > docs/configuration.md`"
    )


def test_every_setting_is_documented() -> None:
    rows = [line for line in reference().splitlines() if line.startswith("| `")]
    assert len(rows) > 50
    undocumented = [row.split("|")[1].strip() for row in rows if row.rstrip().endswith("|  |")]
    assert undocumented == [], f"settings without a docstring under the field: {undocumented}"


def test_check_accepts_a_good_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[store]\naddresses = ["10.0.0.1:7100", "10.0.0.2:7100", "10.0.0.3:7100"]\n[api]\nport = 8081\n')
    assert run(monkeypatch, capsys, "check", str(good)) == (0, f"{good}: ok\n", "")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[api]\nport = 70000\nworkers = 0\n",
            ["api.port: must be in 1..65535", "api.workers: must be in 1..64"],
        ),
        ("[api]\nport = 'eighty'\n", ["api.port: Expected `int`, got `str`"]),
        ("[apii]\nport = 1\n", ["[apii]: no such section"]),
        ("[api]\nlisten = 1\n", ["api.listen: no such setting"]),
        ("[api\n", ["not valid TOML"]),
    ],
)
def test_check_names_each_problem_in_one_line(
    text: str, expected: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    code, out, err = run(monkeypatch, capsys, "check", str(bad))
    lines = err.splitlines()
    assert code == 1 and out == "" and "Traceback" not in err
    assert len(lines) == len(expected) and "config: config:" not in err, lines
    for line, part in zip(lines, expected, strict=True):
        assert line.startswith(f"compensator config: {bad}: ") and part in line, line


def test_check_reports_every_problem_with_its_file_or_variable_and_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[api]\nport = "eighty"\nworkers = "two"\n[store]\ndeadline_s = 100\naddresses = ["nohost"]\n'
                   '[apii]\nx = 1\n[worker]\nlease_ms = 10\nnope = 3\n[handlers]\npayment = { base_url = 5 }\n')  # fmt: skip
    monkeypatch.setenv("COMPENSATOR_QUOTA__BURST", "zero")
    code = cli.main(["config", "check", str(bad)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines() == [f"compensator config: {line}" for line in [
        f"{bad}: api.port: Expected `int`, got `str`",
        f"{bad}: api.workers: Expected `int`, got `str`",
        f"{bad}: [apii]: no such section (the sections: store, api, quota, auth, telemetry, worker, handlers, kafka,"
        " projector, local, review, web, outbox, node, standins, runtime)",
        f"{bad}: worker.nope: no such setting",
        f"{bad}: handlers.payment.base_url: Expected `str`, got `int`",
        "COMPENSATOR_QUOTA__BURST: quota.burst: Expected `int`, got `str`",
        f"{bad}: store.addresses: 'nohost' is not host:port",
        f"{bad}: store.deadline_s: must be at most 60 s (callers wait this long for a 503)",
        f"{bad}: worker.lease_ms: must be in 1000..3600000",
    ]]


def test_check_of_a_missing_file_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(monkeypatch, capsys, "check", str(tmp_path / "nope.toml"))
    assert (code, out) == (1, "") and err == f"compensator config: {tmp_path / 'nope.toml'}: no such file\n"


def test_show_prints_the_configuration_in_force_as_toml_that_loads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.toml"
    source.write_text("[api]\nport = 8082\n")
    code, out, err = run(monkeypatch, capsys, "show", "--config", str(source))
    assert (code, err) == (0, "")
    shown = tmp_path / "shown.toml"
    shown.write_text(out)
    assert tomllib.loads(out)["api"]["port"] == 8082
    assert configuration.load(shown, environ={}) == configuration.load(source, environ={})
