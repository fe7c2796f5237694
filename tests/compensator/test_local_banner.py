"""What `make run` prints, against what the README tells a newcomer to do with it: every fault setting
the walkthrough names has its printed line, and a transfer is printed only behind the grant of the
red packet it pays (the reconciliation of the local run must find a grant behind every payout)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Final

from compensator.commands import run as local
from compensator.config import load

ROOT: Final = Path(__file__).resolve().parents[2]
TOKENS: Final = {"local-producer": "cmp_producer", "local-operator": "cmp_operator"}
PORTS: Final = {"payment": 7201, "red_packet": 7202, "callback": 7203}


def printed() -> list[str]:
    return local.banner(load(None, environ={}), 1, TOKENS, PORTS, {"demo-reviewer": "a", "demo-approver": "b"}).splitlines()


def walkthrough() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("After `make run`, ")
    return readme[start : readme.index("\n\n", start)]


def test_every_fault_setting_the_walkthrough_names_is_printed() -> None:
    named = {json.dumps(json.loads(document)) for document in re.findall(r"`(\{[^`]*\})`", walkthrough())}
    assert {'{"error_rate": 0.5}', '{"permanent_rate": 1.0}', '{"outage_s": 30}'} <= named
    fault_lines = [line for line in printed() if "/_faults" in line]
    missing = [setting for setting in named if not any(f"-d '{setting}'" in line for line in fault_lines)]
    assert missing == []
    assert any("/v1/breakers" in line and "Bearer cmp_operator" in line for line in printed())


def test_the_printed_transfer_pays_the_printed_grant() -> None:
    lines = printed()
    grant = next(line for line in lines if "/red-packets/" in line)
    packet, receiver = re.search(r"/red-packets/([^/ ]+)/receivers/([^/ ]+) ", grant).groups()  # type: ignore[union-attr]
    body = json.loads(next(line for line in lines if line.strip().startswith("-d '{\"kind\"")).strip()[4:-1])
    assert body["ref_key"] == f"{packet}:{receiver}" and body["payload"]["payee"] == receiver
    granted = json.loads(lines[lines.index(grant) + 1].split("-d ", 1)[1].strip("'"))
    assert (granted["amount_minor"], granted["currency"]) == (body["payload"]["amount_minor"], body["payload"]["currency"])
    assert lines.index(grant) < next(i for i, line in enumerate(lines) if "-X POST" in line)
    assert any(line.strip().startswith("COMPENSATOR_API_TOKEN=cmp_producer ") and line.endswith(" demo --transfers 10")
               for line in lines)  # fmt: skip
