"""`python -m bench.queue`'s refusals: a bad combination is one usage line and exit 2, before any
cluster starts (a benchmark that ran ten minutes to ignore an option would mislead its reader)."""

from __future__ import annotations

import pytest

from bench import queue, queue_args


@pytest.mark.parametrize(
    "argv",
    [
        ["drain", "--preload", "5"],
        ["backlog", "--preload", "5"],
        ["enqueue", "--preload", "-1"],
        ["enqueue", "--preload", "5", "--sets", "3"],
    ],
)
def test_preload_is_refused_outside_the_one_set_enqueue_mode(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        queue.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--preload: a count of 0 or more, with the enqueue mode of one set" in err
    assert "Traceback" not in err


def test_uuid_keys_are_the_same_in_every_run_and_distinct() -> None:
    keys = [queue.uuid_key(i) for i in range(1000)]
    assert keys == [queue.uuid_key(i) for i in range(1000)]
    assert len(set(keys)) == 1000
    assert all(len(k) == 36 and k[14] == "4" for k in keys)


def test_a_backlog_message_falls_due_a_day_after_the_start_one_ms_after_the_previous() -> None:
    first, second = (queue.backlog_message(i, queue.uuid_key(i), b"p", 1_000) for i in (0, 1))
    assert (first.due_ms, second.due_ms) == (1_000 + queue.DAY_MS, 1_001 + queue.DAY_MS)
    assert (first.idempotency_key, second.ref_key) == (queue.uuid_key(0), "r1")


def test_every_mode_the_command_line_offers_is_one_the_benchmark_runs() -> None:
    assert tuple(sorted(queue.MODES)) == queue_args.MODE_NAMES
