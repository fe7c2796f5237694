"""A store node's Prometheus metrics: its Raft role, term, indexes, each follower's lag, fsync
batching, and the queue's depth as this replica sees it.

The clock offset is the node's wall clock against the log's clock (what decides due and expired):
a node whose time sync broke shows it, and so does every node when the log ran ahead of them.

Why in the node process: "a node is down" is only visible to a scraper that scrapes each node (its
`up` is 0), "no leader" is the sum of every node's `is_leader`, and a follower's lag is known only
to the leader. The depth gauges come from the node's own replica (no Raft round, no load on the
leader): Prometheus takes them from the leader (`... * on(instance) compensator_raft_is_leader`).

Served by the process's metrics endpoint on the node's own event loop (compensator/
metrics_endpoint.py), so reading the node's state needs no lock: queries run between applies, as
the node's own reads do.

Must never: block the node's loop for long (one status dict and two indexed queries per scrape),
or listen anywhere the operator did not ask.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from queues import query_codec as qc


class NodeCollector(Collector):
    """Built at scrape time from the node's status dict and, between applies, its queue replica."""

    def __init__(self, status: Callable[[], dict[str, Any]], query: Callable[[bytes], bytes | None] | None) -> None:
        self._status = status
        self._query = query

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        node = str(status["node"])
        role = str(status["role"])
        for name, value, text in (
            ("is_leader", 1 if role == "leader" else 0, "1 on the node that leads the set."),
            ("term", status["term"], "The node's Raft term; a rising term means elections."),
            ("commit_index", status["commit"], "The highest log index the node knows is committed."),
            ("applied_index", status["applied"], "The highest log index its queue machine applied."),
            ("last_index", status["last_index"], "The last index in its log."),
            ("snapshot_index", status["snapshot_index"], "The index its latest snapshot covers."),
            ("unapplied_bytes", status["apply"]["unapplied_bytes"],
             "Bytes of the committed entries it has not applied yet (a follower applies in the background)."),
            ("apply_background", 1 if status["apply"]["background"] else 0,
             "1 while its applies run at background priority: a follower within its lag bound (docs/raft.md)."),
            ("failed", 1 if status.get("failure") else 0, "1 when the node stopped itself on a storage failure."),
            ("clock_offset_seconds", status["clock"]["offset_ms"] / 1000,
             "The node's wall clock minus the log's clock as it reads it (raft_store/log_clock.py)."),
        ):
            gauge = GaugeMetricFamily(f"compensator_raft_{name}", text, labels=["node"])
            gauge.add_metric([node], float(value))
            yield gauge
        lag = GaugeMetricFamily("compensator_raft_follower_lag_entries",
                                "On the leader: log entries each follower is behind.", labels=["node", "follower"])  # fmt: skip
        connected = GaugeMetricFamily("compensator_raft_peer_connected",
                                      "On the leader: 1 when the follower's connection is up.", labels=["node", "follower"])  # fmt: skip
        if role == "leader":
            for follower, progress in status["followers"].items():
                lag.add_metric([node, follower], float(progress["lag"]))
                connected.add_metric([node, follower], 1.0 if progress["connected"] else 0.0)
        yield lag
        yield connected
        refused = CounterMetricFamily(
            "compensator_raft_connections_refused",
            "Connections to this node refused before they were let in, by reason: no or a wrong cluster secret"
            " (unknown_secret, bad_proof), TLS, a wrong cluster or protocol, garbage, a handshake that timed out or"
            " was abandoned.", labels=["node", "reason"],
        )  # fmt: skip
        for reason, count in sorted(status["metrics"].get("refused", {}).items()):
            refused.add_metric([node, reason], float(count))
        yield refused
        yield from self._storage(node, status["metrics"])
        if self._query is not None:
            yield from self._queue(node)

    def _storage(self, node: str, metrics: dict[str, Any]) -> Iterator[Metric]:
        fsyncs = CounterMetricFamily("compensator_raft_fsyncs", "WAL fsyncs.", labels=["node"])
        fsyncs.add_metric([node], float(metrics["fsyncs"]))
        yield fsyncs
        entries = CounterMetricFamily(
            "compensator_raft_fsync_entries", "Log entries made durable by those fsyncs.", labels=["node"]
        )
        entries.add_metric([node], float(metrics["fsync_entries_total"]))
        yield entries
        buckets, cumulative = [], 0
        for bound, count in metrics["fsync_batch_buckets"].items():
            cumulative += int(count)
            buckets.append(("+Inf" if bound == "inf" else bound, float(cumulative)))
        batch = HistogramMetricFamily("compensator_raft_fsync_batch_entries",
                                      "Entries per fsync: how well group commit batches.", labels=["node"])  # fmt: skip
        batch.add_metric([node], buckets, sum_value=float(metrics["fsync_entries_total"]))
        yield batch
        slowest = GaugeMetricFamily(
            "compensator_raft_fsync_seconds_max", "The slowest fsync since the node started.", labels=["node"]
        )
        slowest.add_metric([node], float(metrics["fsync_ms_max"]) / 1000)
        yield slowest
        for name, key, text in (
            ("proposed_commands", "proposed_commands", "Commands this node proposed as leader."),
            ("applied_commands", "applied_commands", "Commands its queue machine applied."),
            ("torn_tails", "torn_tails", "Torn WAL tails found and cut at start-up."),
            ("wal_spare_failures", "wal_spare_failures",
             "Next WAL segments that could not be zero-filled ahead of need (then created empty: slower syncs, nothing lost)."),
        ):
            counter = CounterMetricFamily(f"compensator_raft_{name}", text, labels=["node"])
            counter.add_metric([node], float(metrics[key]))
            yield counter

    def _queue(self, node: str) -> Iterator[Metric]:
        """Skipped for a scrape that finds an apply still running after its wait (the next has them)."""
        assert self._query is not None
        counts_raw = self._query(qc.encode_query(qc.Counts()))
        ages_raw = self._query(qc.encode_query(qc.OldestDueAge()))
        if counts_raw is None or ages_raw is None:
            return
        counts, ages = qc.decode_answer(counts_raw), qc.decode_answer(ages_raw)
        depth = GaugeMetricFamily("compensator_queue_depth", "Requests by kind and state (this replica's view).",
                                  labels=["node", "kind", "state"])  # fmt: skip
        if isinstance(counts, qc.CountsAnswer):
            for count in counts.counts:
                depth.add_metric([node, count.kind, count.state.value], float(count.count))
        yield depth
        oldest = GaugeMetricFamily("compensator_queue_oldest_due_age_seconds",
                                   "How long the oldest due request of each kind has waited past its due time.",
                                   labels=["node", "kind"])  # fmt: skip
        if isinstance(ages, qc.OldestDueAnswer):
            for kind, age_ms in ages.ages_ms.items():
                oldest.add_metric([node, kind], age_ms / 1000)
        yield oldest


class HostedCollector(Collector):
    """The replicas of one host process (`node.replicas`, docs/sets.md) on one page: each family
    once, each sample labelled with its replica's `set`, so `sum by (set)` and the single-replica
    queries with `set` added keep working."""

    def __init__(self, replicas: Sequence[tuple[str, Collector]]) -> None:
        self._replicas = list(replicas)

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for set_label, collector in self._replicas:
            for family in collector.collect():
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                into.samples += [sample._replace(labels={**sample.labels, "set": set_label}) for sample in family.samples]
        yield from merged.values()
