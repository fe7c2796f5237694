"""``compensator worker``: one compensation worker (run as many as you like, on any machine).

SIGTERM or Ctrl-C drains it (runner.py): no more leases, running attempts get
`worker.drain_grace_s` to finish, the rest are handed back at once. With `worker.maintenance` it
also runs the queue's maintenance driver, which reads before it writes, so every worker may.

Before it leases, it reads the retry policies from the store (they are set at runtime, not in
the configuration) and refuses to start when one would break what a downstream is declared to
guarantee (compensator/guarantees.py: a re-send past a deduplication window, a second lookup that
would come before the in-flight horizon).

Must never: start on a configuration that did not validate, or print a secret.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from typing import Any

from compensator.api_server import add_config_argument, load


class WorkerCommandError(ValueError):
    """Bad worker settings or secrets: one line, exit 1."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    worker = subparsers.add_parser("worker", help="run a compensation worker (leases, calls downstream, settles)")
    add_config_argument(worker)
    worker.add_argument("--id", default="", help="worker id in leases and events (default host:pid)")
    worker.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    config = load(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(_run(config, args.id))


async def _check_policies(config: Any, running: Any, stop: asyncio.Event) -> None:
    """The kinds' retry policies in the store against the downstreams' declared guarantees; until
    the store answers (a worker may start before its store), or until stopped."""
    from queues import ClientError, QueueError

    while True:
        try:
            kinds = (await running.queue.kinds()).value
            break
        except (ClientError, QueueError) as error:
            logging.getLogger("compensator.worker").warning("cannot read the retry policies yet: %s", error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if stop.is_set():
                return
    from compensator.guarantees import policy_problems

    problems = [p for view in kinds for p in policy_problems(config.handlers, view.kind, view.policy)]
    if problems:
        raise WorkerCommandError(f"{problems[0]} (set the policy with PUT /v1/kinds/{{kind}}/policy, or change"
                                 " the downstream's declaration)")  # fmt: skip


async def _run(config: Any, name: str) -> int:
    from compensator.wiring import worker
    from handlers.registry import RegistryError
    from handlers.signing import SecretsError
    from queues.maintenance import MaintenanceDriver

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        context = worker(config, name=name)
        running = await context.__aenter__()
    except (RegistryError, SecretsError, ValueError) as error:
        raise WorkerCommandError(str(error).splitlines()[0]) from None
    try:
        await _check_policies(config, running, stop)
    except WorkerCommandError:
        with contextlib.suppress(Exception):
            await context.__aexit__(None, None, None)
        raise
    driver = MaintenanceDriver(running.queue) if config.worker.maintenance else None
    server = None
    try:
        if config.worker.metrics_port:
            from prometheus_client import start_http_server

            server, _ = start_http_server(config.worker.metrics_port, config.worker.metrics_host,
                                          registry=running.metrics.registry)  # fmt: skip
        if driver is not None:
            driver.start()
        print(f"worker {running.worker_id} running; SIGTERM drains it", flush=True)
        await running.run(stop)
        print(f"worker {running.worker_id} drained: {running.leased} leased", flush=True)
        return 0
    finally:
        if driver is not None:
            await driver.stop()
        if server is not None:
            server.shutdown()
        with contextlib.suppress(Exception):
            await context.__aexit__(None, None, None)
