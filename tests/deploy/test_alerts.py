"""The alert rules: valid for Prometheus, each one firing on the failure it names (promtool's rule
unit tests), every metric they read one our processes really export, and every alert pointing to
a runbook section that exists."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import ApiMetrics
from compensator.node_metrics import NodeCollector
from compensator.worker.metrics import WorkerMetrics
from queues import QueueClient, RaftClient
from queues.model import Enqueue
from queues.replicated import machine_factory
from raft_store.testing.inprocess import StoreThread, running_store

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus"
PROMETHEUS_OWN = {"up"}


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is needed for the alert rule tests: apt-get install prometheus (.ci/run does)"
    return found


def alerts() -> list[dict[str, Any]]:
    document = yaml.safe_load((RULES / "alerts.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreThread]:
    with running_store(tmp_path_factory.mktemp("store"), machine_factory) as thread:
        yield thread


def exported(store: StoreThread) -> set[str]:
    """Every sample name the node, API and worker processes expose, with a sample in each family."""

    async def node_text() -> bytes:
        queue = QueueClient(RaftClient([store.address], deadline_s=10))
        try:
            await queue.enqueue_many([Enqueue(kind="transfer", idempotency_key="k", ref_key="r", payload=b"p")])
        finally:
            await queue.raft.close()
        assert store.node is not None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(NodeCollector(store.node.status, store.node.query_applied))
        return generate_latest(registry)

    api, worker = ApiMetrics(), WorkerMetrics()
    api.requests.labels("/v1/requests", "POST", "201").inc()
    worker.breaker_open.labels("payment").set(0)
    texts = [store.run(node_text()).decode(), api.exposition().decode(), generate_latest(worker.registry).decode()]
    names = {sample.name for text in texts for family in text_string_to_metric_families(text) for sample in family.samples}
    names |= {family.name for text in texts for family in text_string_to_metric_families(text)}
    return names


def test_the_rules_are_valid_and_each_fires_on_its_failure() -> None:
    checked = subprocess.run([promtool(), "check", "rules", "alerts.yml"], cwd=RULES, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([promtool(), "test", "rules", "alerts.test.yml"], cwd=RULES, capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    unit_tested = set(re.findall(r"alertname: (\w+)", (RULES / "alerts.test.yml").read_text()))
    assert {rule["alert"] for rule in alerts()} <= unit_tested


def test_every_metric_an_alert_reads_is_exported(store: StoreThread) -> None:
    names = exported(store)
    for rule in alerts():
        used = set(re.findall(r"\b(compensator_[a-z_]+|up)\b(?=\s*[{\[)])", rule["expr"]))
        assert used, rule
        missing = used - names - PROMETHEUS_OWN
        assert not missing, f"{rule['alert']} reads {missing}, which no process exports"


def test_every_alert_has_a_severity_a_summary_and_a_runbook_section() -> None:
    headings = re.findall(r"^#+ (.+)$", (ROOT / "docs" / "runbook.md").read_text(), flags=re.MULTILINE)
    anchors = {re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-") for heading in headings}
    for rule in alerts():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule
        assert rule["annotations"]["summary"], rule
        target = rule["annotations"]["runbook"]
        assert target.startswith("docs/runbook.md#") and target.split("#")[1] in anchors, (rule["alert"], target)
