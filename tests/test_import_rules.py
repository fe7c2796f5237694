"""The dependency rules and the size ratchet, checked on the source (an AST walk: no module is
imported to check it).

Each top-level folder of Python has an allow-list of the service's packages it may import
(`MAY_IMPORT`); a new folder fails until it is given its rules. The layers, bottom up:

    raft_store, delay, ledger, outbox   import no other package of the service: the replicated log,
                 the pure retry policies, the shared vocabulary (kinds, currencies, ledger states,
                 the queue states' names, public request ids), and the producers' outbox (a
                 producer installs it alone)
    queues       the queue machine on the log: raft_store, delay
    handlers     the downstream calls and the stand-ins: ledger
    submission   what makes a failed request acceptable, for every intake: queues, delay, ledger
    spark_reconcile  the nightly job: ledger, outbox (never compensator, the composition root)
    api          the HTTP API: queues, delay, ledger, handlers, submission
    services     the worker, the projector, the Kafka bridges: queues, delay, ledger, handlers,
                 submission (never api: what they share with it sits below both; never compensator)
    compensator  the composition root: every package but bench
    bench        the benchmarks: anything

Within those:
    delay        imports no sqlite3 (the policy is pure; the due index is the queue's)
    api          reaches the store only through `queues`' public names: no queues.machine;
                 of handlers only the classification tables (data an operator edits), never a handler
    handlers     only handlers.standins imports the stand-ins, and they import nothing of handlers but
                 the signature scheme (the other side of the wire must not share the handlers'
                 classification or gateway)
    pure cores   import no asyncio, socket, time, os, sqlite3, threading, and use randomness only as an
                 injected `random.Random` (never the module's global generator); every module of
                 queues.core is one, and reaches its state only through the storage port: no store,
                 no machine, no client, nothing of raft_store but the command it applies
    production   never imports a testing or simulation package
    kafka        the Kafka processes and the validation they share with the API load no web framework
    modules      import each other without a cycle (an import deferred into a function still counts;
                 one under `if TYPE_CHECKING:` does not, it never runs)
    sizes        no module above 600 lines and no class above 300 unless `OVERSIZED` lists it, with
                 its size when it was listed as its ceiling: it may shrink (then lower its ceiling),
                 never grow
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[1]
HARNESSES: Final = ("raft_store.testing", "raft_store.simulation", "queues.simulation")
NOT_PACKAGES: Final = frozenset({"tests", "build", "dist", "var", "docs", "deploy"})
"""Top-level folders that are not the service's packages (tests import anything they test)."""

_SERVICE: Final = frozenset({
    "raft_store", "delay", "queues", "ledger", "spark_reconcile", "api", "handlers", "compensator", "outbox",
    "submission", "services",
})  # fmt: skip
MAY_IMPORT: Final[Mapping[str, frozenset[str]]] = {
    "raft_store": frozenset(),
    "delay": frozenset(),
    "ledger": frozenset(),
    "outbox": frozenset(),
    "queues": frozenset({"raft_store", "delay"}),
    "handlers": frozenset({"ledger"}),
    "submission": frozenset({"queues", "delay", "ledger"}),
    "spark_reconcile": frozenset({"ledger", "outbox"}),
    "api": frozenset({"queues", "delay", "ledger", "handlers", "submission"}),
    "services": frozenset({"queues", "delay", "ledger", "handlers", "submission"}),
    "compensator": _SERVICE - {"compensator"},
    "bench": _SERVICE,
}
"""Each top-level package, and the other packages of this repository it may import."""
PACKAGES: Final = tuple(sorted(MAY_IMPORT))
STDLIB_FORBIDDEN: Final[Mapping[str, frozenset[str]]] = {"delay": frozenset({"sqlite3"})}

PURE: Final = (
    "raft_store.core", "raft_store.log", "raft_store.progress", "raft_store.membership", "raft_store.types",
    "raft_store.log_clock", "raft_store.ready_runner", "raft_store.ready", "raft_store.elections",
    "raft_store.replication", "raft_store.heartbeats", "raft_store.following", "raft_store.read_index",
    "queues.model", "queues.events", "queues.views", "queues.lifecycle", "queues.codec", "queues.query_codec",
    "delay.policy",
    "ledger.kinds", "ledger.states", "ledger.currencies", "ledger.request_ids",
    "api.schemas", "submission.models", "submission.rules",
    "services.kafka.event_records", "services.kafka.ingest_records",
    "services.projector.rows",
    "handlers.answers", "handlers.classification", "handlers.tables", "handlers.signing", "handlers.standins.faults",
    "outbox.outcome", "outbox.schema",
    *sorted(f"queues.core.{path.stem}" for path in (ROOT / "queues" / "core").glob("*.py") if path.stem != "__init__"),
)  # fmt: skip
QUEUE_CORE_MAY_NOT: Final = ("lmdb", "sqlite3", "queues.stores", "queues.machine", "queues.replicated", "queues.client",
                             "queues.simulation", "raft_store")  # fmt: skip
QUEUE_CORE_MAY_USE: Final = frozenset({"raft_store.state_machine", "raft_store.state_machine.Command"})
IMPURE: Final = frozenset({"asyncio", "socket", "time", "os", "sqlite3", "threading", "subprocess", "secrets"})

MODULE_LINES_MAX: Final = 600
CLASS_LINES_MAX: Final = 300
OVERSIZED: Final[Mapping[str, int]] = {
    "bench/e2e.py": 678,
    "queues/model.py": 817,
}
"""Modules and classes over the limits, each with its ceiling: its size when it was listed. The
list only shrinks: split one and lower its number (or drop it once under the limit)."""


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _import_statements(path: Path, *, at_run_time: bool = False) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(module, names) of each import statement, relative ones resolved within the package:
    `import a.b` is ("a.b", ()), `from a import b, c` is ("a", ("b", "c")). With `at_run_time`, not
    those under `if TYPE_CHECKING:` (they never run)."""
    module = _module(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    type_only = {id(inner) for node in ast.walk(tree) if at_run_time and isinstance(node, ast.If) and _type_checking(node)
                 for statement in node.body for inner in ast.walk(statement)}  # fmt: skip
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            yield from ((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: -node.level] if path.name != "__init__.py" or node.level > 1 else module.split(".")
                base = ".".join([*anchor, base] if base else anchor)
            yield base, tuple(alias.name for alias in node.names)


def _imports(path: Path) -> Iterator[str]:
    """Every module an import statement names, and each name it imports from one (which may be a module)."""
    for base, names in _import_statements(path):
        yield base
        yield from (f"{base}.{name}" for name in names)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_folders() -> set[str]:
    """Every folder (or module) of Python at the top of the repository that is part of the service."""
    found: set[str] = set()
    for entry in ROOT.iterdir():
        if entry.name.startswith(".") or entry.name in NOT_PACKAGES or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir() and next(entry.rglob("*.py"), None) is not None:
            found.add(entry.name)
        elif entry.suffix == ".py":
            found.add(entry.stem)
    return found


def test_every_folder_has_its_rules() -> None:
    """A new folder fails here until MAY_IMPORT says what it may import (and docstring above, why)."""
    folders = _top_level_folders()
    assert sorted(folders - set(MAY_IMPORT)) == [], "a folder without rules: give it its MAY_IMPORT entry (and why)"
    assert sorted(set(MAY_IMPORT) - folders) == [], "rules for a folder that is gone: drop them"
    for package in PACKAGES:
        assert _files(package), f"{package} has no modules"
    for name in PURE:
        assert (ROOT / (name.replace(".", "/") + ".py")).exists(), name


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_imports_only_what_its_rules_allow(package: str) -> None:
    allowed = MAY_IMPORT[package] | {package}
    forbidden_stdlib = STDLIB_FORBIDDEN.get(package, frozenset())
    offending = sorted(
        f"{path.relative_to(ROOT)}: {imported}"
        for path in _files(package)
        for imported in _imports(path)
        if (imported.split(".")[0] in MAY_IMPORT and imported.split(".")[0] not in allowed)
        or imported.split(".")[0] in forbidden_stdlib
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


def test_the_queue_core_reaches_its_state_only_through_the_port() -> None:
    offending = sorted(
        f"{path.relative_to(ROOT)}: {imported}"
        for path in _files("queues/core")
        for imported in _imports(path)
        if imported not in QUEUE_CORE_MAY_USE
        and any(imported == name or imported.startswith(name + ".") for name in QUEUE_CORE_MAY_NOT)
    )
    assert offending == []
    assert len([name for name in PURE if name.startswith("queues.core.")]) >= 20  # every module is in PURE


def test_production_code_never_imports_a_test_harness() -> None:
    offending = sorted(
        f"{path.relative_to(ROOT)}: {imported}"
        for package in PACKAGES
        if package != "bench"  # the benchmarks start real processes with the testing harness's cluster
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
    """`compensator kafka-ingest` validates requests with the API's rules (submission/rules.py)
    without FastAPI or Starlette in the process: its command, its wiring and its services."""
    script = (
        "import sys, compensator.commands.kafka, compensator.wiring.kafka, services.kafka.ingest, services.kafka.publisher;"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette', 'uvicorn'));"
        "print(loaded); sys.exit(1 if loaded else 0)"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _module_graph() -> dict[str, set[str]]:
    """Module -> the modules of this repository it imports when it runs (an import deferred into a
    function too: it only moves a cycle to the first call)."""
    paths = {_module(path): path for package in PACKAGES for path in _files(package)}
    graph: dict[str, set[str]] = {module: set() for module in paths}
    for module, path in paths.items():
        for base, names in _import_statements(path, at_run_time=True):
            # `from a import b` imports the module a.b where there is one, else (a name in a) a itself
            for imported in [f"{base}.{name}" if f"{base}.{name}" in paths else base for name in names] or [base]:
                target = imported
                while target and target not in paths:  # `import a.b.c` of a name outside: its module
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph[module].add(target)
    return graph


def _cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            following = next(successors, None)
            if following is not None:
                if following not in index:
                    index[following] = low[following] = len(index)
                    stack.append(following)
                    on_stack.add(following)
                    work.append((following, iter(sorted(graph[following]))))
                elif following in on_stack:
                    low[node] = min(low[node], index[following])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_two_modules_import_each_other_even_through_others() -> None:
    cycles = _cycles(_module_graph())
    assert cycles == [], "modules that import each other (through these): " + "; ".join(map(" ".join, cycles))


def _sizes() -> dict[str, int]:
    """Every module's lines, and every class's (its `class` line to its last), by path[::Class]."""
    sizes: dict[str, int] = {}
    for package in PACKAGES:
        for path in _files(package):
            text = path.read_text()
            name = str(path.relative_to(ROOT))
            sizes[name] = len(text.splitlines())
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                    sizes[f"{name}::{node.name}"] = node.end_lineno - node.lineno + 1
    return sizes


def _limit(name: str) -> int:
    return CLASS_LINES_MAX if "::" in name else MODULE_LINES_MAX


def test_no_module_or_class_outgrows_its_limit_or_its_listed_ceiling() -> None:
    sizes = _sizes()
    over = sorted(f"{name}: {size} lines, over {_limit(name)}: split it" for name, size in sizes.items()
                  if size > _limit(name) and name not in OVERSIZED)  # fmt: skip
    grown = sorted(f"{name}: {sizes[name]} lines, over its ceiling of {ceiling}: split it, never raise the ceiling"
                   for name, ceiling in OVERSIZED.items() if sizes.get(name, 0) > ceiling)  # fmt: skip
    assert over + grown == [], "\n".join(over + grown)


def test_the_list_of_oversized_modules_only_shrinks() -> None:
    sizes = _sizes()
    stale = sorted(
        f"{name}: gone or within {_limit(name)} lines: remove its entry" if sizes.get(name, 0) <= _limit(name)
        else f"{name}: now {sizes[name]} lines: lower its ceiling from {ceiling} to {sizes[name]}"
        for name, ceiling in OVERSIZED.items() if sizes.get(name, 0) < ceiling
    )  # fmt: skip
    assert stale == [], "\n".join(stale)
