"""Import direction: compensator is the composition root; the job and the shared vocabulary never import it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "spark_reconcile": {"compensator"},
    "ledger": {"compensator", "spark_reconcile", "api", "handlers"},
}


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            found.add(node.module)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_never_imports_its_callers(package: str) -> None:
    files = sorted((REPOSITORY / package).rglob("*.py"))
    assert files
    offending = {
        f"{path.relative_to(REPOSITORY)}: {module}"
        for path in files
        for module in _imported_modules(path)
        if module.split(".")[0] in FORBIDDEN[package]
    }
    assert offending == set()
