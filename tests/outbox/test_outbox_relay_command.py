"""``compensator outbox-relay`` as an operator runs it: a child process, settings from the
environment, the token from a file; one line for what is wrong, and the token never printed."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import asyncpg
from outbox_support import ApiServer, producer_token, rows, transfer

import outbox
from raft_store.testing.inprocess import StoreThread

ROOT = Path(__file__).resolve().parents[2]


async def relay_once(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("COMPENSATOR_")}
    environment["PYTHONPATH"] = str(ROOT)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "compensator", "outbox-relay", "--once", *args, cwd=ROOT, env={**environment, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_command_sends_what_is_due_and_says_what_is_left(
    producer_dsn: str, store: StoreThread, api: ApiServer, tmp_path: Path
) -> None:
    connection = await asyncpg.connect(producer_dsn)
    try:
        for number in range(3):
            await outbox.add(connection, transfer(number))
    finally:
        await connection.close()
    await api.up()
    async with producer_token(store) as token:
        token_file = tmp_path / "token"
        token_file.write_text(token + "\n")
        env = {"COMPENSATOR_OUTBOX__DSN": producer_dsn, "COMPENSATOR_OUTBOX__API_URL": api.url,
               "COMPENSATOR_OUTBOX__TOKEN_FILE": str(token_file)}  # fmt: skip
        code, out, err = await relay_once(env)
        assert (code, err) == (0, ""), err
        assert "sent 3, rejected 0; outbox: 0 pending" in out
        assert token not in out + err
        await api.down()
        await outbox_add(producer_dsn, transfer(9))
        code, out, err = await relay_once(env)
        assert code == 1
        assert "1 pending" in out and token not in out + err
    assert [row["state"] for row in await rows(producer_dsn)] == ["sent"] * 3 + ["pending"]


async def outbox_add(dsn: str, request: outbox.OutboxRequest) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await outbox.add(connection, request)
    finally:
        await connection.close()


async def test_what_is_missing_is_one_line(producer_dsn: str, tmp_path: Path) -> None:
    bare = producer_dsn.rsplit("/", 1)[0] + "/postgres"
    cases = [
        ({}, "outbox.dsn is empty"),
        ({"COMPENSATOR_OUTBOX__DSN": producer_dsn}, "no API token: set outbox.token_file, or $COMPENSATOR_OUTBOX_TOKEN"),
        ({"COMPENSATOR_OUTBOX__DSN": producer_dsn, "COMPENSATOR_OUTBOX__TOKEN_FILE": str(tmp_path / "absent")},
         "outbox.token_file: cannot read it"),
        ({"COMPENSATOR_OUTBOX__DSN": bare, "COMPENSATOR_OUTBOX_TOKEN": "cmp_x"}, "table compensator_outbox is missing"),
        ({"COMPENSATOR_OUTBOX__DSN": producer_dsn, "COMPENSATOR_OUTBOX__BACKOFF_MIN_S": "9",
          "COMPENSATOR_OUTBOX__BACKOFF_MAX_S": "1"}, "environment: outbox: backoff must satisfy"),
    ]  # fmt: skip
    for env, expected in cases:
        code, out, err = await relay_once(env)
        assert code == 1 and out == "", (env, out, err)
        assert len(err.splitlines()) == 1 and expected in err, (env, err)
