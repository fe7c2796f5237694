"""The dependency rules, checked on the source (an AST walk: no module is imported to check it).

    raft_store   imports none of the service's other packages
    delay        imports neither queues nor sqlite3 (the policy is pure; the due index is the queue's)
    queues       imports none of ledger, api, handlers, compensator, spark_reconcile
    ledger       imports none of compensator, spark_reconcile, api, handlers
    spark_reconcile  never imports compensator (compensator is the composition root)
    outbox       imports none of the service's packages: a producer installs it and speaks HTTP only
    api          reaches the store only through `queues`' public names: no raft_store, no queues.machine;
                 of handlers only the classification tables (data an operator edits), never a handler
    handlers     imports none of compensator, api, spark_reconcile; only handlers.standins imports the
                 stand-ins, and they import nothing of handlers but the signature scheme (the other
                 side of the wire must not share the handlers' classification or gateway)
    pure cores   import no asyncio, socket, time, os, sqlite3, threading, and use randomness only as an
                 injected `random.Random` (never the module's global generator)
    production   never imports a testing or simulation package
    kafka        the Kafka processes and the validation they share with the API load no web framework
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[1]
PACKAGES: Final = (
    "raft_store", "delay", "queues", "ledger", "spark_reconcile", "api", "handlers", "compensator", "outbox",
)  # fmt: skip
HARNESSES: Final = ("raft_store.testing", "raft_store.simulation", "queues.simulation")

FORBIDDEN: Final = {
    "raft_store": {p for p in PACKAGES if p != "raft_store"},
    "delay": {"queues", "sqlite3", *(p for p in PACKAGES if p != "delay")},
    "queues": {"ledger", "api", "handlers", "compensator", "spark_reconcile"},
    "ledger": {"compensator", "spark_reconcile", "api", "handlers"},
    "spark_reconcile": {"compensator", "api", "handlers"},
    "api": {"raft_store", "compensator", "spark_reconcile"},
    "handlers": {"compensator", "api", "spark_reconcile"},
    "outbox": {p for p in PACKAGES if p != "outbox"},
}
PURE: Final = (
    "raft_store.core", "raft_store.log", "raft_store.progress", "raft_store.membership", "raft_store.types",
    "raft_store.log_clock",
    "queues.model", "queues.lifecycle", "queues.codec", "queues.query_codec",
    "delay.policy",
    "ledger.kinds", "ledger.states", "ledger.currencies",
    "api.ids", "api.schemas", "api.submissions",
    "compensator.kafka.event_records", "compensator.kafka.ingest_records",
    "compensator.projector.rows",
    "handlers.answers", "handlers.classification", "handlers.tables", "handlers.signing", "handlers.standins.faults",
    "outbox.outcome", "outbox.schema",
)  # fmt: skip
IMPURE: Final = frozenset({"asyncio", "socket", "time", "os", "sqlite3", "threading", "subprocess", "secrets"})


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imports(path: Path) -> Iterator[str]:
    """Every module an import statement names (relative imports resolved within the package)."""
    module = _module(path)
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: -node.level] if path.name != "__init__.py" or node.level > 1 else module.split(".")
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def test_every_package_is_checked() -> None:
    for package in PACKAGES:
        assert _files(package), f"{package} has no modules"
    for name in PURE:
        assert (ROOT / (name.replace(".", "/") + ".py")).exists(), name


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_only_what_it_builds_on(package: str) -> None:
    offending = sorted(
        f"{path.relative_to(ROOT)}: {imported}"
        for path in _files(package)
        for imported in _imports(path)
        if imported.split(".")[0] in FORBIDDEN[package]
    )
    assert offending == []


def test_api_reaches_the_store_only_through_the_queue_client() -> None:
    offending = sorted(
        f"{path.relative_to(ROOT)}: {imported}"
        for path in _files("api")
        for imported in _imports(path)
        if imported.startswith("queues.") and imported.split(".")[1][:1].islower()
        and imported.split(".")[1] not in {"client"}  # `from queues import X` names X, a public name
        and (ROOT / "queues" / (imported.split(".")[1] + ".py")).exists()
    )  # fmt: skip
    assert offending == []


API_MAY_IMPORT_FROM_HANDLERS: Final = frozenset({"handlers.classification", "handlers.tables"})


def test_api_takes_only_the_classification_tables_from_handlers() -> None:
    offending = sorted(
        f"{path.relative_to(ROOT)}: {imported}"
        for path in _files("api")
        for imported in _imports(path)
        if imported.startswith("handlers")
        and not any(imported == m or imported.startswith(m + ".") for m in API_MAY_IMPORT_FROM_HANDLERS)
    )
    assert offending == []


@pytest.mark.parametrize("module", PURE)
def test_pure_cores_do_no_io_and_read_no_clock(module: str) -> None:
    path = ROOT / (module.replace(".", "/") + ".py")
    assert sorted({i for i in _imports(path) if i.split(".")[0] in IMPURE}) == []
    global_random = sorted(
        f"line {node.lineno}: random.{node.attr}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "random"
        and node.attr != "Random"
    )  # fmt: skip
    assert global_random == []
    assert not any(i.startswith("random.") and i != "random.Random" for i in _imports(path))


def test_production_code_never_imports_a_test_harness() -> None:
    offending = sorted(
        f"{path.relative_to(ROOT)}: {imported}"
        for package in PACKAGES
        for path in _files(package)
        if not _module(path).startswith(HARNESSES)
        for imported in _imports(path)
        if imported.startswith(HARNESSES)
    )
    assert offending == []


STANDINS: Final = "handlers.standins"
STANDINS_MAY_USE: Final = frozenset({"handlers.signing"})


def test_the_stand_ins_and_the_handlers_share_only_the_signature_scheme() -> None:
    handlers_reaching_standins = sorted(
        f"{path.relative_to(ROOT)}: {imported}"
        for path in _files("handlers")
        if not _module(path).startswith(STANDINS)
        for imported in _imports(path)
        if imported.startswith(STANDINS)
    )
    standins_reaching_handlers = sorted(
        f"{path.relative_to(ROOT)}: {imported}"
        for path in _files("handlers/standins")
        for imported in _imports(path)
        if imported.split(".")[0] == "handlers" and not imported.startswith(STANDINS)
        and imported not in STANDINS_MAY_USE and imported.rsplit(".", 1)[0] not in STANDINS_MAY_USE
    )  # fmt: skip
    assert (handlers_reaching_standins, standins_reaching_handlers) == ([], [])


def test_the_kafka_processes_and_the_shared_validation_load_no_web_framework() -> None:
    """`compensator kafka-ingest` validates requests with the API's rules (api/submissions.py)
    without FastAPI or Starlette in the process."""
    script = (
        "import sys, compensator.kafka.command, compensator.kafka.ingest, compensator.kafka.publisher;"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette', 'uvicorn'));"
        "print(loaded); sys.exit(1 if loaded else 0)"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
