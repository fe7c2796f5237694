"""The garbage collector's policy (compensator/gc_policy.py) is in force once each process kind has
started: the process shell applies it after the process is built and before its work runs, the
API after its lifespan started, every root passes `[runtime]`'s settings, and the pauses are among
the process's metrics. Each test puts CPython's own settings back (the test process is shared)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest

from api.metrics import ApiMetrics
from compensator import config as configuration
from compensator.gc_policy import GcPauses, GcPolicy, apply
from compensator.shell import Running, Shell, serve
from compensator.wiring import api, kafka, node, outbox, projector, worker


@pytest.fixture(autouse=True)
def cpython_defaults() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_apply_freezes_what_is_alive_and_raises_the_young_threshold() -> None:
    _, gen1, gen2 = gc.get_threshold()
    apply(GcPolicy(freeze=True, gen0_threshold=40_000))
    assert gc.get_threshold() == (40_000, gen1, gen2)
    assert gc.get_freeze_count() > 1000  # the test process's modules, at least
    gc.unfreeze()
    apply(GcPolicy(freeze=False, gen0_threshold=0))  # the off switches: nothing changes
    assert gc.get_threshold() == (40_000, gen1, gen2) and gc.get_freeze_count() == 0


def test_pauses_are_counted_by_generation_while_installed() -> None:
    registry = CollectorRegistry()
    with GcPauses() as pauses:
        registry.register(pauses)
        gc.collect(1)
        gc.collect(2)
    gc.collect(2)  # not counted: removed
    assert pauses.collections[1] == 1 and pauses.collections[2] == 1 and pauses.seconds[2] > 0
    text = generate_latest(registry).decode()
    assert 'python_gc_pauses_total{generation="2"} 1.0' in text
    assert 'python_gc_pause_seconds_total{generation="0"}' in text


async def test_the_shell_applies_the_policy_once_built_before_the_work_runs() -> None:
    registry = CollectorRegistry()
    seen: dict[str, object] = {}

    async def run(stop: asyncio.Event) -> int:
        seen["threshold"], seen["frozen"] = gc.get_threshold()[0], gc.get_freeze_count()
        seen["metrics"] = b"python_gc_pause_seconds_total" in generate_latest(registry)
        return 0

    @contextlib.asynccontextmanager
    async def build() -> AsyncIterator[Running]:
        seen["built_with"] = gc.get_threshold()[0]
        yield Running(run, registry=registry)

    before = gc.get_threshold()[0]
    assert await serve(Shell(name="test", gc=GcPolicy(gen0_threshold=30_000)), build) == 0
    assert seen["built_with"] == before and seen["threshold"] == 30_000
    assert isinstance(seen["frozen"], int) and seen["frozen"] > 1000 and seen["metrics"] is True
    assert b"python_gc_pause" not in generate_latest(registry)  # taken out with the work


async def test_the_api_applies_it_once_its_lifespan_started() -> None:
    started: list[int] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        started.append(gc.get_freeze_count())
        yield

    app, metrics = FastAPI(lifespan=lifespan), ApiMetrics()
    api.after_start_up(app, GcPolicy(gen0_threshold=20_000), metrics)
    async with app.router.lifespan_context(app):
        assert started == [0] and gc.get_freeze_count() > 1000 and gc.get_threshold()[0] == 20_000
        assert b"python_gc_pause_seconds_total" in metrics.exposition()
    assert b"python_gc_pause" not in metrics.exposition()


def test_every_process_kind_is_given_the_runtime_settings() -> None:
    config = configuration.load(
        None, {"COMPENSATOR_RUNTIME__GC_FREEZE": "false", "COMPENSATOR_RUNTIME__GC_GEN0_THRESHOLD": "9000"}
    )
    wanted = GcPolicy(freeze=False, gen0_threshold=9000)
    shells = [worker.shell(config), kafka.shell(config, "kafka-ingest"), projector.shell(config), node.shell(config),
              outbox.shell(config, once=False)]  # fmt: skip
    assert [shell.gc for shell in shells] == [wanted] * len(shells)
    assert configuration.load(None, {}).runtime.gc_gen0_threshold == 50_000
    with pytest.raises(configuration.ConfigError, match=r"runtime\.gc_gen0_threshold"):
        configuration.load(None, {"COMPENSATOR_RUNTIME__GC_GEN0_THRESHOLD": "-1"})


async def test_uvicorn_s_factory_builds_the_api_with_the_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "cluster.secret"
    secret.write_text("s" * 64)
    secret.chmod(0o600)
    monkeypatch.setenv("COMPENSATOR_STORE__SECRET_FILE", str(secret))
    monkeypatch.setenv("COMPENSATOR_STORE__ADDRESSES", "127.0.0.1:9")  # nothing listens: the lifespan does not wait
    monkeypatch.setenv("COMPENSATOR_STORE__DEADLINE_S", "0.3")
    monkeypatch.setenv("COMPENSATOR_STORE__ATTEMPT_TIMEOUT_S", "0.1")
    monkeypatch.setenv("COMPENSATOR_RUNTIME__GC_GEN0_THRESHOLD", "25000")
    app = api.api_app_from_environment()
    async with asyncio.timeout(20), app.router.lifespan_context(app):
        assert gc.get_threshold()[0] == 25_000 and gc.get_freeze_count() > 1000
