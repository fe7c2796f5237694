"""The process shell every long-running process runs in (compensator/shell.py): a stop signal sets
the work's stop event and the work ends as it chooses, the metrics endpoint is up exactly while the
work runs, an expected failure is one line, and a real process gets uvloop, the one log format and
exit status 0 after SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from compensator.shell import ProcessError, Running, Shell, serve
from raft_store.testing.processes import free_ports

ROOT = Path(__file__).resolve().parents[2]


class Refused(Exception):
    """A failure a process kind names as expected."""


async def _get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as client:
        return await client.get(url)


async def test_a_stop_signal_ends_the_work_and_the_metrics_are_served_while_it_runs() -> None:
    (port,) = free_ports(1)
    registry = CollectorRegistry()
    Counter("shell_test_steps", "Steps.", registry=registry).inc(3)
    seen: dict[str, object] = {}

    async def run(stop: asyncio.Event) -> int:
        answer = await _get(f"http://127.0.0.1:{port}/metrics")
        seen["metrics"] = (answer.status_code, "shell_test_steps_total 3.0" in answer.text)
        seen["other"] = (await _get(f"http://127.0.0.1:{port}/")).status_code
        os.kill(os.getpid(), signal.SIGTERM)  # as a launcher stops it
        await asyncio.wait_for(stop.wait(), 5)
        return 7

    @contextlib.asynccontextmanager
    async def build() -> AsyncIterator[Running]:
        yield Running(run, registry=registry)

    assert await serve(Shell(name="test", metrics=("127.0.0.1", port)), build) == 7
    assert seen == {"metrics": (200, True), "other": 404}
    with pytest.raises(httpx.ConnectError):  # the endpoint ends with the work
        await _get(f"http://127.0.0.1:{port}/metrics")


async def test_an_expected_failure_is_one_line_and_a_taken_metrics_port_too() -> None:
    async def refuse(stop: asyncio.Event) -> int:
        raise Refused("the broker at kafka:9092 did not answer\nsecond line never shown")

    @contextlib.asynccontextmanager
    async def build() -> AsyncIterator[Running]:
        yield Running(refuse, registry=CollectorRegistry())

    with pytest.raises(ProcessError) as refused:
        await serve(Shell(name="test", expected=(Refused,)), build)
    assert str(refused.value) == "the broker at kafka:9092 did not answer"
    with pytest.raises(Refused):  # not named as expected: not turned into a line
        await serve(Shell(name="test"), build)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ProcessError, match=rf"^metrics on 127.0.0.1:{port}: "):
            await serve(Shell(name="test", metrics=("127.0.0.1", port)), build)


async def test_an_expected_failure_inside_a_task_group_is_still_one_line_and_a_bug_is_not_hidden() -> None:
    """The worker's lanes run in a task group, which wraps what a task raises."""

    def building(failure: Exception) -> Callable[[], contextlib.AbstractAsyncContextManager[Running]]:
        async def run(stop: asyncio.Event) -> int:
            async def fail() -> None:
                raise failure

            async with asyncio.TaskGroup() as group:
                group.create_task(fail())
            return 0

        @contextlib.asynccontextmanager
        async def build() -> AsyncIterator[Running]:
            yield Running(run, registry=CollectorRegistry())

        return build

    with pytest.raises(ProcessError) as refused:
        await serve(Shell(name="test", expected=(Refused,)), building(Refused("set 2 refused us\ndetail")))
    assert str(refused.value) == "set 2 refused us"
    with pytest.raises(ExceptionGroup):  # a bug keeps its traceback for the log
        await serve(Shell(name="test", expected=(Refused,)), building(KeyError("lane")))


def test_a_process_runs_on_uvloop_logs_one_way_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import asyncio, contextlib, logging, sys
        from compensator.shell import Running, Shell, run

        async def work(stop):
            logging.getLogger("compensator.test").info("working")
            print(type(asyncio.get_running_loop()).__module__, flush=True)
            await stop.wait()
            print("stopped", flush=True)
            return 0

        @contextlib.asynccontextmanager
        async def build():
            yield Running(work)

        sys.exit(run(Shell(name="test"), build))
    """)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, env=environ, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert process.stdout is not None
        loop_module = process.stdout.readline().strip()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert (loop_module, out.strip(), process.returncode) == ("uvloop", "stopped", 0), err
    assert " compensator.test INFO working" in err
