"""`compensator audit verify` as a process: against a running store, whose chain the review
commands wrote through QueueClient, and against copies of its state store file, one of them
altered in one entry."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import msgspec

from queues import Code, QueueClient, RaftClient
from queues.core.keys import u64
from queues.core.port import Table
from queues.core.records import audit_decoder, encode
from queues.model import Discard, ProposalState, Redrive
from queues.replicated import DB_NAME, machine_factory
from queues.stores.lmdb_store import LmdbStore
from raft_store.testing.credentials import cluster_auth, service_settings
from raft_store.testing.inprocess import StoreThread, running_store

HOUR_MS = 3_600_000


def _compensator(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "compensator", *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})  # fmt: skip


async def _review(store: StoreThread) -> None:
    """Dead letters, then every review action through the client, as the API will send them."""
    queue = QueueClient(RaftClient([store.address], auth=store.auth))
    try:
        ids = []
        for key in ("a", "b", "c"):
            ids.append((await queue.enqueue("transfer", idempotency_key=key, ref_key="rp-1", payload=b"{}")).message_id)
        for grant in (await queue.lease("w", count_max=3, lease_ms=30_000)).grants:
            await queue.fail(grant.message_id, grant.token, "insufficient_funds", permanent=True)
        edited = await queue.edit_redrive(ids[0], b'{"amount_minor": 5}', actor="alice", reason="amount typo")
        assert edited.code is Code.OK and len(edited.new_ids) == 1
        discard = Discard(message_id=ids[1], actor="alice", reason="paid by hand", reason_code="paid_manually")
        proposal = await queue.propose(discard, ttl_ms=HOUR_MS)
        assert (await queue.approve(proposal.proposal_id, approver="alice")).code is Code.OWN_PROPOSAL
        assert (await queue.approve(proposal.proposal_id, approver="bob")).code is Code.OK
        redrive = await queue.propose(Redrive(actor="alice", reason="retry", ids=(ids[2],)), ttl_ms=HOUR_MS)
        rejected = await queue.reject(redrive.proposal_id, actor="bob", reason="not yet")
        assert rejected.proposal_state is ProposalState.REJECTED
        listed = (await queue.proposals()).value
        assert [(p.proposal_id, p.state) for p in listed] == [(2, ProposalState.REJECTED), (1, ProposalState.APPROVED)]
        timeline = (await queue.message_audit([edited.new_ids[0]])).value
        assert [entry.action for entry in timeline] == ["edit_redrive"]
        page = (await queue.audit_log(after=0, limit=100)).value
        assert [e.action for e in page.entries] == ["edit_redrive", "propose", "approve", "discarded", "propose",
                                                    "reject"]  # fmt: skip
    finally:
        await queue.raft.close()


def test_verify_passes_on_the_store_and_its_copy_and_names_the_entry_altered_in_a_copy(tmp_path: Path) -> None:
    data = tmp_path / "node"
    with running_store(data, machine_factory) as store:
        store.run(_review(store))
        clean = _compensator("audit", "verify", env=store.service_settings())
        assert clean.returncode == 0, clean.stderr
        assert json.loads(clean.stdout)["entries"] == 6 and json.loads(clean.stdout)["verified"] is True
    copy, altered = tmp_path / "copy.lmdb", tmp_path / "altered.lmdb"
    shutil.copyfile(data / DB_NAME, copy)
    shutil.copyfile(data / DB_NAME, altered)
    ok = _compensator("audit", "verify", "--state", str(copy))
    assert ok.returncode == 0 and json.loads(ok.stdout)["entries"] == 6, ok.stderr
    store = LmdbStore(altered)
    with store.write() as tx:
        row = audit_decoder.decode(tx.get(Table.AUDIT, u64(3)) or b"")
        tx.put(Table.AUDIT, u64(3), encode(msgspec.structs.replace(row, reason="approved, honest")))
    store.close()
    broken = _compensator("audit", "verify", "--state", str(altered))
    assert broken.returncode == 1 and broken.stdout == ""
    (line,) = broken.stderr.splitlines()
    assert line.startswith(f"compensator audit verify: {altered}: broken at audit entry 3 (approve of proposal:1 by bob")
    assert line.endswith("its content does not match its hash (the entry was altered)")


def test_bad_input_is_one_line_and_a_nonzero_exit(tmp_path: Path) -> None:
    missing = _compensator("audit", "verify", "--state", str(tmp_path / "nothing.lmdb"))
    assert missing.returncode == 1 and missing.stderr.startswith("compensator audit: error: ") and missing.stdout == ""
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).close()
    wrong = _compensator("audit", "verify", "--state", str(other))
    assert wrong.returncode == 1
    assert wrong.stderr == f"compensator audit: error: {other} is not a queue state store with an audit chain\n"
    unreachable = _compensator("audit", "verify", env={**service_settings([("127.0.0.1", 9)], cluster_auth(tmp_path)),
                                                        "COMPENSATOR_STORE__DEADLINE_S": "1"})  # fmt: skip
    assert unreachable.returncode == 1 and len(unreachable.stderr.splitlines()) == 1
    assert unreachable.stderr.startswith("compensator audit: error: the store at 127.0.0.1:9 did not answer")
