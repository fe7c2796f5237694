"""The masking choke point (api/masked_reads.py): every value the store answers with that holds a
payload-like field is masked wherever it is in an answer, or was decided to hold no personal
data; a masked message hides its payload's personal values wherever they appear in it; and the
masked client writes nothing."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any, Final

import msgspec
import pytest

from api.masked_reads import MASKED_TYPES, MaskedQueueClient, masked_answer, masked_proposal, masked_view
from queues import (
    EditRedrive,
    MessageView,
    ProposalState,
    ProposalView,
    QueueClient,
    QueueError,
    RaftClient,
    State,
    codec,
)
from queues import query_codec as qc
from queues.model import AttemptView, Redrive
from raft_store.testing.credentials import cluster_auth

PAYLOAD = {"transfer_id": "tr-1", "payer": "acct-6222020012345678", "payee": "acct-6222020087654321",
           "amount_minor": 6000, "currency": "USD", "memo": "for Zhang Wei"}  # fmt: skip


PAYLOAD_LIKE: Final = frozenset({"payload", "edited_payload", "body", "before", "after", "data", "headers",
                                  "error_text", "last_error_text", "dead_reason"})  # fmt: skip
"""Fields that hold, or may quote, what a producer sent."""
DECIDED: Final = {
    "AttemptView": "a message's attempts: masked with the message (their error texts)",
    "DocumentView": "the API's own namespaces (users, sessions, logins, breakers, tables): no customer data",
}
"""Values that hold such a field and are not masked, with why."""


def _structs(kind: Any, seen: set[type[Any]]) -> None:
    for arg in typing.get_args(kind):
        _structs(arg, seen)
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct) and kind not in seen:
        seen.add(kind)
        for annotation in typing.get_type_hints(kind).values():
            _structs(annotation, seen)


def test_every_value_the_store_answers_with_a_payload_like_field_is_masked_or_decided() -> None:
    found: set[type[Any]] = set()
    _structs(qc.QueryAnswer, found)
    holding = {kind.__name__ for kind in found if PAYLOAD_LIKE & set(kind.__struct_fields__)}
    assert {kind.__name__ for kind in MASKED_TYPES} <= holding  # they are reached, and masked
    assert holding - {kind.__name__ for kind in MASKED_TYPES} == set(DECIDED), holding


def test_a_new_answer_that_carries_messages_is_masked_without_being_listed() -> None:
    class Unlisted(msgspec.Struct, frozen=True):
        found: tuple[MessageView, ...]
        count: int

    masked = masked_answer(Unlisted(found=(_view(),), count=1))
    assert json.loads(masked.found[0].payload)["payer"] == "****5678" and masked.count == 1


def _view(**changes: typing.Any) -> MessageView:
    base = MessageView(
        message_id=7, kind="transfer", idempotency_key="p:k", ref_key="rp-1", payload=json.dumps(PAYLOAD).encode(),
        edited_payload=None, headers={"failure-text": "no answer for acct-6222020087654321"}, created_ms=1,
        state=State.DEAD, due_ms=1, attempts=1, last_error_class="closed",
        last_error_text="account acct-6222020012345678 is closed; memo 'for Zhang Wei'", token=0, lease_worker=None,
        lease_deadline_ms=None, dead_ms=2, dead_reason="permanent", terminal_ms=None,
        history=(AttemptView(attempt=1, token=1, worker_id="w", leased_ms=1, ended_ms=2, outcome="failed",
                             error_class="closed", error_text="acct-6222020012345678 closed"),),
    )  # fmt: skip
    return msgspec.structs.replace(base, **changes)


def test_a_message_hides_its_personal_values_in_its_payload_and_its_free_text() -> None:
    masked = masked_view(_view())
    assert json.loads(masked.payload) == {**PAYLOAD, "payer": "****5678", "payee": "****4321", "memo": "****"}
    assert masked.last_error_text == "account ****5678 is closed; memo '****'"
    assert masked.headers == {"failure-text": "no answer for ****4321"}
    assert masked.history[0].error_text == "****5678 closed"
    text = masked_view(_view(payload=b"not json")).payload
    assert json.loads(text) == "****"


def test_an_edit_proposal_hides_the_payload_it_proposes() -> None:
    edited = {**PAYLOAD, "payee": "acct-6222020099990000"}
    action = EditRedrive(message_id=7, payload=json.dumps(edited).encode(), actor="ann", reason="new account")
    view = ProposalView(proposal_id=1, action="edit_redrive", proposer="ann", reason="new account", targets=(7,),
                        created_ms=1, expires_ms=2, state=ProposalState.PENDING, body=codec.encode_command(action))  # fmt: skip
    shown = codec.decode_command(masked_proposal(view).body)
    assert isinstance(shown, EditRedrive) and json.loads(shown.payload)["payee"] == "****0000"
    redrive = msgspec.structs.replace(view, body=codec.encode_command(Redrive(actor="ann", reason="r", ids=(7,))))
    assert masked_proposal(redrive) == redrive


async def test_the_masked_client_writes_nothing(tmp_path: Path) -> None:
    raft = RaftClient([("127.0.0.1", 9)], auth=cluster_auth(tmp_path), deadline_s=0.1)
    client = MaskedQueueClient(QueueClient(raft))
    with pytest.raises(QueueError, match="writes nothing"):
        await client.redrive("ann", "why", ids=[1])
    with pytest.raises(QueueError, match="writes nothing"):
        await client.enqueue_many([])
    await raft.close()
