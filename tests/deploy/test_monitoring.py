"""Alert rules and dashboards: the rules valid for Prometheus, each one firing on the failure it
names (promtool's rule unit tests), every metric a rule or a dashboard panel reads one our
processes really export, and every alert pointing to a runbook section that exists."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from api.metrics import ApiMetrics
from queues import QueueClient, RaftClient
from queues.model import Enqueue
from queues.replicated import machine_factory
from raft_store.testing.inprocess import StoreThread, running_store
from services.kafka.metrics import KafkaMetrics
from services.node_metrics import NodeCollector
from services.projector.metrics import ProjectorMetrics
from services.worker.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus"
PROMETHEUS_OWN = {"up"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is needed for the alert rule tests: apt-get install prometheus"
                    " (deploy/install-system-packages.sh installs it)", pytrace=False)  # fmt: skip
    return found


def alerts() -> list[dict[str, Any]]:
    document = yaml.safe_load((RULES / "alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreThread]:
    with running_store(tmp_path_factory.mktemp("store"), machine_factory) as thread:
        yield thread


def exported(store: StoreThread) -> set[str]:
    """Every series name the node, API, worker, Kafka and projector processes expose (with the suffixes
    Prometheus gives counters and histograms)."""

    async def node_families() -> list[Metric]:
        queue = QueueClient(RaftClient([store.address], auth=store.auth, deadline_s=10))
        try:
            await queue.enqueue_many([Enqueue(kind="transfer", idempotency_key="k", ref_key="r", payload=b"p")])
        finally:
            await queue.raft.close()
        assert store.node is not None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(NodeCollector(store.node.status, store.node.query_applied))
        while store.node.applying:  # as a scrape does: the queue's gauges need the machine
            await asyncio.sleep(0.005)
        return list(registry.collect())  # on the node's loop, as a scrape is

    families = store.run(node_families())
    for registry in (ApiMetrics().registry, WorkerMetrics().registry, KafkaMetrics().registry,
                     ProjectorMetrics().registry):  # fmt: skip
        families += registry.collect()
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "gauge": ("",), "summary": ("_sum", "_count")}  # fmt: skip
    names: set[str] = set()
    for family in families:
        names |= {family.name + suffix for suffix in suffixes[family.type]}
    return names


def metrics_read(expr: str) -> set[str]:
    return set(re.findall(r"\b(compensator_[a-z_]+|up)\b(?=\s*[{\[)])", expr))


def panel_exprs() -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            found += [(f"{path.name}: {panel['title']}", target["expr"]) for target in panel.get("targets", [])]
    return found


def test_the_rules_are_valid_and_each_fires_on_its_failure() -> None:
    checked = subprocess.run([promtool(), "check", "rules", "alerts.yml"], cwd=RULES, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([promtool(), "test", "rules", "alerts.test.yml"], cwd=RULES, capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    unit_tested = set(re.findall(r"alertname: (\w+)", (RULES / "alerts.test.yml").read_text()))
    assert {rule["alert"] for rule in alerts()} <= unit_tested


def test_every_metric_an_alert_or_a_panel_reads_is_exported(store: StoreThread) -> None:
    names = exported(store)
    reads = [(rule["alert"], rule["expr"]) for rule in alerts()] + panel_exprs()
    assert len(reads) > 20
    for where, expr in reads:
        used = metrics_read(expr)
        assert used, (where, expr)
        missing = used - names - PROMETHEUS_OWN
        assert not missing, f"{where} reads {missing}, which no process exports"


def test_the_dashboards_cover_what_the_on_call_needs() -> None:
    exprs = " ".join(expr for _, expr in panel_exprs())
    for metric in ("compensator_api_requests_total", "compensator_queue_depth", "compensator_queue_oldest_due_age_seconds",
                   "compensator_worker_attempts_total", "compensator_worker_breaker_open", "compensator_api_store_seconds_bucket",
                   "compensator_raft_fsync_batch_entries_bucket", "compensator_kafka_publisher_lag_seconds",
                   "compensator_kafka_ingest_lag"):  # fmt: skip
        assert metric in exprs, metric
    for path in (ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"):
        ids = [panel["id"] for panel in json.loads(path.read_text())["panels"]]
        assert len(ids) == len(set(ids)), path


def test_every_alert_has_a_severity_a_summary_and_a_runbook_section() -> None:
    headings = re.findall(r"^#+ (.+)$", (ROOT / "docs" / "runbook.md").read_text(), flags=re.MULTILINE)
    anchors = {re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-") for heading in headings}
    for rule in alerts():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule
        assert rule["annotations"]["summary"], rule
        target = rule["annotations"]["runbook"]
        assert target.startswith("docs/runbook.md#") and target.split("#")[1] in anchors, (rule["alert"], target)
