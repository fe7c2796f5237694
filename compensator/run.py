"""`make run`: the service on one machine with embedded defaults, for development and demos.

Starts a 3-node Raft set of real node processes on loopback (data under var/local, kept between
runs), waits for a leader and prints where everything listens. Ctrl-C stops it. As the queue,
workers and API land, they are started here too, so this stays the one command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import signal
import sys
from pathlib import Path

from raft_store.client import RaftClient
from raft_store.testing.processes import ProcessCluster

DEFAULT_PORTS = [7101, 7102, 7103]


def machine_name() -> str:
    """The queue machine when it is installed, the key-value machine otherwise."""
    return "queues.replicated:machine_factory" if importlib.util.find_spec("queues.replicated") else "kv"


async def serve(cluster: ProcessCluster, stop: asyncio.Event) -> None:
    client = RaftClient(cluster.addresses())
    leader = await cluster.wait_leader(client, timeout_s=30)
    addresses = ",".join(f"{h}:{p}" for h, p in cluster.addresses())
    print(json.dumps({"event": "ready", "raft_nodes": addresses, "leader": leader,
                      "machine": cluster.machine, "data": str(cluster.root)}), flush=True)
    print(f"status:  .venv/bin/raft-store status --addresses {addresses}", flush=True)
    driver = auditor = None
    if cluster.machine.startswith("queues."):
        # Lease expiry and tombstone purge are commands someone must propose: run the driver.
        # The replica audit compares the replicas' event logs and logs a divergence at ERROR.
        from queues.audit import ReplicaAuditor, replica_clients
        from queues.client import QueueClient
        from queues.maintenance import MaintenanceDriver

        driver = MaintenanceDriver(QueueClient(client))
        driver.start()
        auditor = ReplicaAuditor(replica_clients(cluster.addresses()))
        auditor.start()
    while not stop.is_set():
        for node, proc in cluster.procs.items():
            if proc.poll() is not None:
                print(f"node {node} exited with {proc.returncode}; restarting it", flush=True)
                cluster.start(node)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    if driver is not None:
        await driver.stop()
    if auditor is not None:
        from queues.audit import close_clients

        await auditor.stop()
        await close_clients(auditor.replicas)
    await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compensator.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="var/local", help="where the nodes keep their data")
    parser.add_argument("--ports", default=",".join(map(str, DEFAULT_PORTS)), help="three loopback ports")
    args = parser.parse_args(argv)
    try:
        ports = [int(p) for p in args.ports.split(",")]
    except ValueError:
        print("compensator.run: --ports takes three comma-separated numbers", file=sys.stderr)
        return 2
    if len(ports) != 3:
        print("compensator.run: --ports takes exactly three ports", file=sys.stderr)
        return 2
    cluster = ProcessCluster(Path(args.data), size=3, machine=machine_name(), ports=ports)
    cluster.start_all()
    stop = asyncio.Event()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(cluster, stop)

    try:
        asyncio.run(run())
    finally:
        cluster.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
