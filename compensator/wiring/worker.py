"""The worker process kind (``compensator worker``): a compensation worker (services/worker/) with
its store client, its handlers and their connections, its limits and its tracer; and beside it,
with `worker.maintenance`, the queue's maintenance driver for each set (it reads before it writes,
so every worker may run one). The worker leases from every set: `store.set_id`'s alone, or with
`store.control_addresses` every set of the control set's table (docs/sets.md).

Before it leases, the process reads the retry policies from the store (they are set at runtime,
not in the configuration) and refuses to start when one would break what a downstream is declared
to guarantee (compensator/guarantees.py: a re-send past a deduplication window, a second lookup
that would come before the in-flight horizon).

Must never: run anything at import, start on a policy that breaks a declared guarantee, or print
a secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from opentelemetry.sdk.trace.export import SpanExporter

from compensator.config import Config
from compensator.config_processes import worker_breaker
from compensator.guarantees import policy_problems
from compensator.shell import ProcessError, Running, Shell
from compensator.telemetry import tracer_provider
from compensator.wiring.parts import (
    callback_secrets,
    every_set,
    gc_policy,
    metrics_address,
    process_name,
    table_rereader,
)
from handlers.registry import Registry, RegistryError, build_registry
from handlers.signing import SecretsError
from queues import ClientError, KindView, QueueClient, QueueError
from queues.maintenance import SERVICE, MaintenanceDriver
from services.worker.limits import Limits
from services.worker.metrics import WorkerMetrics
from services.worker.runner import Worker, WorkerSettings

log = logging.getLogger("compensator.worker")


def shell(config: Config) -> Shell:
    settings = config.worker
    return Shell(name="worker", metrics=metrics_address(settings.metrics_host, settings.metrics_port),
                 expected=(RegistryError, SecretsError), gc=gc_policy(config))  # fmt: skip


@contextlib.asynccontextmanager
async def worker(config: Config, *, name: str = "", registry: Registry | None = None,
                 span_exporter: SpanExporter | None = None) -> AsyncIterator[Worker]:  # fmt: skip
    """A worker for this configuration, with its store client and its handlers' connections,
    closed on exit. The handlers come from `config.handlers` and the callback secrets (a file or
    $COMPENSATOR_CALLBACK_SECRETS) unless a registry is given."""
    settings = config.worker
    sets, found = await every_set(config)
    provider = tracer_provider(config.telemetry, exporter=span_exporter, process="worker")
    metrics = WorkerMetrics()
    if registry is None:
        path = Path(settings.callback_secrets_file) if settings.callback_secrets_file else None
        registry = build_registry(config.handlers, secrets=callback_secrets(path, os.environ) or {},
                                  tracer=provider.get_tracer("compensator.handlers"), events=metrics.handler_event)  # fmt: skip
    handlers = {kind.value: handler for kind, handler in registry.handlers.items()}
    pools = {"payment": config.handlers.payment.gateway, "red_packet": config.handlers.red_packet.gateway,
             "callback": config.handlers.callback.gateway}  # fmt: skip
    limits = Limits(
        per_kind=dict.fromkeys(handlers, settings.concurrency_per_kind),
        # Never more attempts at once than the downstream's client has connections: an attempt
        # waiting for a pooled connection can only time out (`pool_exhausted`).
        per_downstream={h.downstream: min(settings.concurrency_per_downstream, pools[h.downstream].connections_max)
                        for h in handlers.values()},
        downstream_of={kind: h.downstream for kind, h in handlers.items()},
    )  # fmt: skip
    built = Worker(
        sets, handlers, limits,
        WorkerSettings(worker_id=name or process_name(), lease_ms=settings.lease_ms, batch_max=settings.batch_max,
                       idle_poll_s=settings.idle_poll_ms / 1000, idle_wait_s=settings.idle_wait_ms / 1000,
                       drain_grace_s=settings.drain_grace_s,
                       breaker=worker_breaker(settings)),
        tracer=provider.get_tracer("compensator.worker"), metrics=metrics, registry=registry,
        discover=None if found is None else table_rereader(found), discover_every_s=config.store.sets_refresh_s,
    )  # fmt: skip
    try:
        yield built
    finally:
        await registry.aclose()
        if found is not None:
            await found.close()  # every set's client, the ones found later too, and the control set's
        else:
            for queue in sets.values():
                await queue.raft.close()
        provider.shutdown()


async def check_policies(config: Config, sets: Mapping[int, QueueClient], stop: asyncio.Event) -> None:
    """The kinds' retry policies in the store against the downstreams' declared guarantees; until
    a set answers (a worker may start before its store), or until stopped. With many sets, from
    the lowest-numbered that answers (cluster-wide documents: services/worker/documents.py)."""
    while True:
        try:
            kinds = await _first_answer(sets)
            break
        except (ClientError, QueueError) as error:
            log.warning("cannot read the retry policies yet: %s", error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if stop.is_set():
                return
    problems = [p for view in kinds for p in policy_problems(config.handlers, view.kind, view.policy)]
    if problems:
        raise ProcessError(f"{problems[0]} (set the policy with PUT /v1/kinds/{{kind}}/policy, or change"
                           " the downstream's declaration)")  # fmt: skip


async def _first_answer(sets: Mapping[int, QueueClient]) -> Sequence[KindView]:
    error: ClientError | QueueError | None = None
    for set_id in sorted(sets):
        try:
            return (await sets[set_id].kinds()).value
        except (ClientError, QueueError) as failed:
            error = failed
    assert error is not None
    raise error


@contextlib.asynccontextmanager
async def process(config: Config, *, name: str = "") -> AsyncIterator[Running]:
    """`compensator worker`: SIGTERM drains it (services/worker/runner.py): no more leases, running
    attempts get `worker.drain_grace_s` to finish, the rest are handed back at once."""
    async with worker(config, name=name) as running:
        sets = {set_id: lane.queue for set_id, lane in running.lanes.items()}
        drivers = {s: MaintenanceDriver(queue, SERVICE) for s, queue in sets.items()} if config.worker.maintenance else {}
        stopping: list[asyncio.Task[None]] = []

        def new_set(set_id: int, queue: QueueClient) -> None:
            """A set added, or moved (its new client): its driver runs on that client."""
            if config.worker.maintenance:
                old = drivers.pop(set_id, None)
                if old is not None:
                    stopping.append(asyncio.create_task(old.stop()))
                drivers[set_id] = MaintenanceDriver(queue, SERVICE)
                drivers[set_id].start()

        async def run(stop: asyncio.Event) -> int:
            await check_policies(config, sets, stop)
            for driver in drivers.values():
                driver.start()
            print(f"worker {running.worker_id} running; SIGTERM drains it", flush=True)
            await running.run(stop, new_set=new_set)
            print(f"worker {running.worker_id} drained: {running.leased} leased", flush=True)
            return 0

        try:
            yield Running(run, registry=running.metrics.registry)
        finally:
            for driver in drivers.values():
                await driver.stop()
            for task in stopping:
                await task
