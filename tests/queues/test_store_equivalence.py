"""The queue core computes what the SQL queue machine computed, on every store.

tests/queues/equivalence/recorded.msgpack.gz holds logs applied by the SQL machine of fe4a6b3 (a
scripted workload over every command, and two queue simulation seeds' committed logs), with the
result of every command, the answers to a battery of queries and the canonical state at points of
each log (equivalence/record.py says how it was recorded, and how to record it again). Replaying
the same logs here must give the same result bytes (where a client reads them: a follower's
sessionless results are not computed), the same answer bytes and the same canonical state: the
replicated behaviour did not change with the store.
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from queues import codec
from queues.core.config import QueueConfig
from queues.replicated import ReplicatedQueueMachine
from queues.stores.lmdb_store import LmdbStore
from queues.stores.sqlite_store import SqliteStore
from raft_store.state_machine import Command

FIXTURE = Path(__file__).parent / "equivalence" / "recorded.msgpack.gz"
T0 = 1_700_000_000_000


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=12).digest()


def _state_digests(state: dict[str, Any]) -> dict[str, bytes]:
    return {name: _digest(msgspec.msgpack.encode(value)) for name, value in state.items()}


def _logs() -> list[dict[str, Any]]:
    logs: list[dict[str, Any]] = msgspec.msgpack.decode(gzip.decompress(FIXTURE.read_bytes()))["logs"]
    return logs


def _describe(step: int, command: bytes) -> str:
    decoded = codec.decode_command(command)
    return f"entry {step}: {decoded!r}"[:400]


def _compare_state(machine: ReplicatedQueueMachine, expected: dict[str, Any], where: str) -> None:
    state = msgspec.msgpack.decode(msgspec.msgpack.encode(machine.canonical()))
    if all(isinstance(value, bytes) and len(value) == 12 for value in expected.values()):
        differs = sorted(name for name, value in _state_digests(state).items() if expected.get(name) != value)
        assert not differs, f"{where}: the canonical state differs in {differs}"
        return
    for name, rows in expected.items():
        if state[name] != rows:
            mine, theirs = state[name], rows
            if isinstance(mine, list) and isinstance(theirs, list):
                first = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
                detail = f"first difference at row {first}: {mine[first] if first is not None else None!r} against {theirs[first] if first is not None else None!r}; {len(mine)} rows against {len(theirs)}"
            else:
                detail = f"{mine!r} against {theirs!r}"
            raise AssertionError(f"{where}: canonical {name} differs: {detail}"[:3000])


def _replay(log: dict[str, Any], machine: ReplicatedQueueMachine) -> None:
    checks = list(log["checks"])
    results = iter(log["results"])
    position = 0

    def check_due() -> None:
        while checks and checks[0]["after"] == position:
            check = checks.pop(0)
            where = f"after entry {position}"
            _compare_state(machine, check["state"], where)
            for query, expected in check["queries"]:
                answer = machine.query(query)
                got = answer if len(expected) != 12 else _digest(answer)
                assert got == expected, f"{where}: {query!r} answered differently: {answer[:600]!r}"

    check_due()
    for index, now_ms, commands, respond in log["entries"]:
        position += 1
        if commands is None:
            machine.note_applied(index)
        else:
            answered = machine.apply_batch(index, now_ms, [Command(c, s, d) for c, s, d in commands], respond=respond)
            for (client_id, _, data), result in zip(commands, answered, strict=True):
                expected = next(results)
                if respond or client_id:
                    assert _digest(result) == expected, f"{_describe(position, data)} answered {result[:300]!r}"
                else:
                    assert result == b""
        check_due()
    assert not checks


@pytest.mark.parametrize("store", ["sqlite", "lmdb"])
def test_the_core_replays_the_recorded_logs_as_the_sql_machine_did(store: str, tmp_path: Path) -> None:
    for number, log in enumerate(_logs()):
        retention_ms, event_retention_ms, floor_ms = log["config"]
        config = QueueConfig(retention_ms=retention_ms, event_retention_ms=event_retention_ms,
                             retention_floor_ms=floor_ms)  # fmt: skip
        kv = SqliteStore() if store == "sqlite" else LmdbStore(tmp_path / f"log{number}.lmdb")
        machine = ReplicatedQueueMachine(kv, config, clock_ms=lambda: T0)
        try:
            _replay(log, machine)
        finally:
            machine.close()
