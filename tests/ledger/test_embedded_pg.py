"""The embedded PostgreSQL (`make run`'s, the tests'): nobody else on the machine gets in. Its
superuser has a generated password, asked on TCP and on the unix socket alike; the socket sits in
a private folder; a data directory an older version made trusting every local connection gets a
password at its next start; and the DSN's password never reaches a printed line."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from ledger import pg


@pytest.fixture
def folder() -> Iterator[Path]:
    # A path longer than the unix socket's limit allows beside it: the socket goes to a private folder.
    root = Path(tempfile.mkdtemp(prefix="compensator-pg-test-"))
    try:
        yield root / ("deep-" * 16)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


async def refused(**connect: object) -> str:
    with pytest.raises((asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)) as error:
        connection = await asyncpg.connect(**connect, timeout=10)  # type: ignore[arg-type]
        await connection.close()
    return type(error.value).__name__


def test_only_the_generated_password_gets_in_on_tcp_and_on_the_socket(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSFILE", str(folder.parent / "no-pgpass"))  # nothing but what each test gives
    with pg.EmbeddedPostgres(folder / "data") as server:
        address = server.address
        password = server.password()
        assert password and len(password) >= 32 and password in server.dsn
        assert password not in pg.redacted(server.dsn) and ":***@" in pg.redacted(server.dsn)
        assert password not in repr(address)
        data = server.data_dir
        assert mode(data) == 0o700 and mode(data / pg.PASSWORD_FILE) == 0o600
        postmaster = (data / "postmaster.pid").read_text().splitlines()
        socket_dir = Path(postmaster[4])
        assert socket_dir != Path(tempfile.gettempdir()) and mode(socket_dir) == 0o700
        assert mode(socket_dir / f".s.PGSQL.{address.port}") & 0o077 == 0

        async def check() -> None:
            connection = await asyncpg.connect(server.dsn, timeout=10)
            assert await connection.fetchval("SELECT current_user") == pg.SUPERUSER
            await connection.close()
            tcp = {"host": address.host, "port": address.port, "user": pg.SUPERUSER, "database": pg.DATABASE}
            await refused(**tcp)
            await refused(**tcp, password="not-the-password")
            await refused(**{**tcp, "host": str(socket_dir)})
            await refused(**{**tcp, "host": str(socket_dir), "user": "embedded_postgres"})

        asyncio.run(check())
        assert pg.EmbeddedPostgres(folder / "data").running_dsn() == server.dsn  # a reader finds it too
    assert not socket_dir.exists()


def test_a_data_directory_that_trusted_everyone_gets_a_password_at_its_next_start(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSFILE", str(folder.parent / "no-pgpass"))
    old = pg.EmbeddedPostgres(folder / "data")
    (folder / "data").mkdir(parents=True, mode=0o700)
    old._prepare_permissions()
    pg._wheel_commands().initdb(["--auth=trust", "--encoding=UTF8", "--locale=C", "-U", pg.SUPERUSER],
                                pgdata=old.data_dir, **old._run_as())  # fmt: skip
    assert old.password() is None
    with pg.EmbeddedPostgres(folder / "data") as server:
        assert server.password() is not None

        async def check() -> None:
            connection = await asyncpg.connect(server.dsn, timeout=10)
            await connection.close()
            await refused(host=server.address.host, port=server.address.port, user=pg.SUPERUSER)

        asyncio.run(check())


def test_a_standby_streams_from_its_primary_and_a_commit_waits_for_it(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.peer_procrastinate's queue: fsync back on, and a synchronous standby made by
    pg_basebackup with the primary's password, so a commit is acknowledged on two servers."""
    monkeypatch.setenv("PGPASSFILE", str(folder.parent / "no-pgpass"))
    durable = {"fsync": "on", "synchronous_standby_names": "the_standby"}
    with pg.EmbeddedPostgres(folder / "primary", settings=durable) as primary:
        standby = pg.EmbeddedPostgres(folder / "standby", settings={"fsync": "on"}, standby_of=primary.address,
                                      application_name="the_standby")  # fmt: skip
        with standby:
            assert standby.password() == primary.password()

            async def check() -> None:
                writer = await asyncpg.connect(primary.dsn, timeout=10)
                reader = await asyncpg.connect(standby.dsn, timeout=10)
                try:
                    assert await writer.fetchval("SHOW fsync") == "on"
                    replicas = await writer.fetch("SELECT application_name, sync_state FROM pg_stat_replication")
                    assert [(r["application_name"], r["sync_state"]) for r in replicas] == [("the_standby", "sync")]
                    await writer.execute("CREATE TABLE acknowledged (n int); INSERT INTO acknowledged VALUES (7)")
                    assert await reader.fetchval("SELECT pg_is_in_recovery()") is True
                    for _ in range(100):  # flushed there before the commit returned; applied a moment later
                        if await reader.fetchval("SELECT to_regclass('acknowledged') IS NOT NULL"):
                            break
                        await asyncio.sleep(0.05)
                    assert await reader.fetchval("SELECT n FROM acknowledged") == 7
                finally:
                    await reader.close()
                    await writer.close()

            asyncio.run(check())


_PG_CTL_SAYS = "pg_ctl: could not send stop signal (PID: 4242): Operation not permitted"


@pytest.fixture
def failing_pg_ctl() -> Iterator[Path]:
    """A pg_ctl that fails as the real one does when it cannot signal the server (one stderr
    line, exit 1); in a folder the server's system user can run it from (when we are root)."""
    bin_dir = Path(tempfile.mkdtemp(prefix="compensator-pg-ctl-"))
    try:
        bin_dir.chmod(0o755)
        script = bin_dir / "pg_ctl"
        script.write_text(f'#!/bin/sh\necho "{_PG_CTL_SAYS}" >&2\nexit 1\n')
        script.chmod(0o755)
        yield script
    finally:
        shutil.rmtree(bin_dir, ignore_errors=True)


def test_a_stop_that_fails_says_so_and_the_commands_that_stop_it_exit_1(
    folder: Path, failing_pg_ctl: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pg_ctl stop that fails while the server still runs is not swallowed: `stop` raises with the
    data directory and pg_ctl's line, the server stays this object's (a second stop tries again),
    and the processes that stop their embedded server (`compensator project`, `standins`: the
    root's `ledger_database`) end with that line and exit 1, or, when their work failed, print it
    before the work's own line."""
    from compensator.shell import ProcessError
    from compensator.wiring.parts import ledger_database

    monkeypatch.delenv(pg.DSN_ENV, raising=False)
    data = folder / "data"
    real = pg.pg_ctl_path()
    said = f"the embedded PostgreSQL in {data.resolve()} did not stop: {_PG_CTL_SAYS}"
    server = pg.EmbeddedPostgres(data)
    try:
        server.start()
        monkeypatch.setattr(pg, "pg_ctl_path", lambda: failing_pg_ctl)
        with pytest.raises(pg.StopFailed) as failed:
            server.stop()
        assert str(failed.value) == said
        assert server.running_pid() is not None, "it still runs, as the line says"
        monkeypatch.setattr(pg, "pg_ctl_path", lambda: real)
        server.stop()
        assert server.running_pid() is None

        async def a_process(work_fails: bool) -> None:
            async with ledger_database(data):
                monkeypatch.setattr(pg, "pg_ctl_path", lambda: failing_pg_ctl)
                if work_fails:
                    raise ProcessError("the work's own line")

        for work_fails, line in ((False, said), (True, "the work's own line")):
            with pytest.raises(ProcessError) as ended:
                asyncio.run(a_process(work_fails))
            assert str(ended.value) == line
            assert capsys.readouterr().err.splitlines() == ([said] if work_fails else [])
            monkeypatch.setattr(pg, "pg_ctl_path", lambda: real)
            assert server.running_pid() is not None
            server.stop_any()
            assert server.running_pid() is None
    finally:
        monkeypatch.setattr(pg, "pg_ctl_path", lambda: real)
        server.stop_any()


def test_reconcile_and_the_local_launcher_say_a_failed_stop_and_exit_1(
    folder: Path, failing_pg_ctl: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The other two commands that stop an embedded server of their own keep the same rule:
    `compensator reconcile` (its `--pg-data` server) ends with the stop's line (ReconcileError:
    one line, exit 1), or prints it before its own failure's; `compensator run` (`make run`'s
    launcher) stops everything else, then keeps the line for its exit 1 (`database_left_running`)."""
    import argparse

    from compensator.commands.run import LocalService, local_pg_data
    from compensator.config import load
    from spark_reconcile import command

    monkeypatch.delenv(pg.DSN_ENV, raising=False)
    real = pg.pg_ctl_path()
    data = folder / "reconcile"
    said = f"the embedded PostgreSQL in {data.resolve()} did not stop: {_PG_CTL_SAYS}"
    arguments = argparse.Namespace(pg_data=str(data))
    server = pg.EmbeddedPostgres(data)
    try:
        for work_fails, line in ((False, said), (True, "the run's own line")):
            with pytest.raises(command.ReconcileError) as ended, command._database(arguments, create=True):
                monkeypatch.setattr(pg, "pg_ctl_path", lambda: failing_pg_ctl)
                if work_fails:
                    raise command.ReconcileError("the run's own line")
            assert str(ended.value) == line
            assert capsys.readouterr().err.splitlines() == ([said] if work_fails else [])
            monkeypatch.setattr(pg, "pg_ctl_path", lambda: real)
            assert server.running_pid() is not None, "it still runs, as the line says"
            server.stop_any()
            assert server.running_pid() is None
    finally:
        monkeypatch.setattr(pg, "pg_ctl_path", lambda: real)
        server.stop_any()

    config = load(None, {"COMPENSATOR_LOCAL__DATA_DIR": str(folder / "local")})
    launched = pg.EmbeddedPostgres(local_pg_data(config))
    said = f"the embedded PostgreSQL in {local_pg_data(config).resolve()} did not stop: {_PG_CTL_SAYS}"

    async def launch_and_stop() -> str | None:
        service = LocalService(config, config_path=None)
        service.start_database()
        assert await service.database_ready()
        assert service.pg_dsn is not None and all(c.env["COMPENSATOR_PG_DSN"] == service.pg_dsn
                                                  for c in (*service.standins, *service.projectors))  # fmt: skip
        monkeypatch.setattr(pg, "pg_ctl_path", lambda: failing_pg_ctl)
        await service.stop_database()
        return service.database_left_running

    try:
        assert asyncio.run(launch_and_stop()) == said
        monkeypatch.setattr(pg, "pg_ctl_path", lambda: real)
        assert launched.running_pid() is not None, "it still runs, as the line says"
    finally:
        monkeypatch.setattr(pg, "pg_ctl_path", lambda: real)
        launched.stop_any()
    assert launched.running_pid() is None
