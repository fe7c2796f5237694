"""The store as a caller without personal-data rights reads it: one choke point for masking.

A viewer (a `viewer` token, a viewer's session) must never see an account number, a phone number,
a name or any other personal value, on any page or in any JSON answer. Masking in each page and
serializer depended on each remembering to: the approvals inbox's edit diffs forgot, and showed a
viewer both accounts of an edit. So the masking is done here, once, on the store's answers
themselves: `MaskedQueueClient` is a `QueueClient` whose every read answer has its payloads
masked (ledger/masking.py) before any code of the API sees it, and which writes nothing. The
API hands it to every request whose caller may not see personal data (`ApiServices.masked`,
chosen by `api.services.of`), so whatever a page or a serializer computes from what it read (a
diff, a total, a CSV row, a timeline) is computed from masked values already.

What is masked, by answer:
- a message (`MessageView`): its payload and edited payload (the kind's personal fields), and
  every personal value of those payloads wherever it appears in the message's free text too (the
  downstream's error texts, the dead-letter reason, the producer's failure text in the headers): a
  downstream that says "account closed-6222020012345678 is closed" does not unmask it;
- a proposal (`ProposalView`): an edit's proposed payload inside its body;
- an audit entry: the payloads held in its before and after (its hash stays the unmasked entry's:
  a viewer can follow the chain's links, not recompute an entry);
- an event: a payload in its data.

Every other answer holds no personal data (counts, summaries, jobs and their items, kinds,
policies, documents of the API's own namespaces, ...); `PASSED` lists them, and a new answer type
is refused until it is listed here or masked (tests/api/test_masked_reads.py checks both ways).

Must never: write to the store (a viewer changes nothing; a write through this client raises), or
let an answer type through that nobody has classified.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import msgspec

from ledger.kinds import canonical_json
from ledger.masking import MASK, mask_any_payload, mask_identifier, mask_payload
from queues import AuditEntry, Event, MessageView, ProposalView, QueueClient, QueueError, Read, codec
from queues import query_codec as qc
from queues.model import EditRedrive, QueueCommand, QueueResult

SCRUBBED_LENGTH_MIN: Final = 4
"""A personal string this long or longer is masked wherever it appears in a message's free text
(shorter ones would mask ordinary words: an account of three characters is masked in the payload
only)."""
VERSIONS_MAX: Final = 20
"""Versions read each way to mask an edited message's inherited free text (the request page shows 20)."""
SCRUBBED_DIGITS_MIN: Final = 7
"""A number with this many digits (a phone number in a callback body) counts as a personal string."""


def _document(payload: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(payload)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def masked_payload(kind: str, payload: bytes) -> bytes:
    """The payload's bytes with its personal fields masked (canonical JSON); a payload that is not
    a JSON object shows nothing of itself."""
    document = _document(payload)
    return canonical_json(MASK if document is None else mask_payload(kind, document))


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, int) and not isinstance(value, bool) and len(str(abs(value))) >= SCRUBBED_DIGITS_MIN:
        yield str(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def personal_values(kind: str, payloads: Iterable[bytes | None]) -> dict[str, str]:
    """Each personal value of these payloads (long enough to look for) -> how it is shown masked (an
    account as its last four, free text and a callback body's values hidden whole): whatever
    `mask_payload` changes is personal, by definition."""
    found: dict[str, str] = {}
    for payload in payloads:
        document = None if payload is None else _document(payload)
        if document is None:
            continue
        masked = mask_payload(kind, document)
        for name, value in document.items():
            if masked.get(name) == value:
                continue
            identifier = isinstance(value, str) and masked.get(name) == mask_identifier(value)
            for text in _strings(value):
                if len(text) >= SCRUBBED_LENGTH_MIN:
                    found[text] = mask_identifier(text) if identifier else MASK
    return found


def scrubbed(text: str | None, values: Mapping[str, str]) -> str | None:
    """Free text with every personal value in it masked, the longest first (a value inside another
    is not left half shown)."""
    if text is None or not values:
        return text
    for value in sorted(values, key=len, reverse=True):
        if value in text:
            text = text.replace(value, values[value])
    return text


def masked_view(view: MessageView, also: Mapping[str, str] | None = None) -> MessageView:
    """The message with its payloads masked and every personal value of them, and `also` (its
    other versions' values), masked in its free text."""
    values = {**(also or {}), **personal_values(view.kind, (view.payload, view.edited_payload))}
    history = tuple(msgspec.structs.replace(a, error_text=scrubbed(a.error_text, values)) for a in view.history)
    return msgspec.structs.replace(
        view, payload=masked_payload(view.kind, view.payload),
        edited_payload=None if view.edited_payload is None else masked_payload(view.kind, view.edited_payload),
        headers={name: scrubbed(value, values) or "" for name, value in view.headers.items()},
        last_error_text=scrubbed(view.last_error_text, values), dead_reason=scrubbed(view.dead_reason, values),
        history=history,
    )  # fmt: skip


def masked_proposal(view: ProposalView) -> ProposalView:
    """An edit's proposed payload masked inside the proposal's body (the command as proposed)."""
    if not view.body:
        return view
    action = codec.decode_command(view.body)
    if not isinstance(action, EditRedrive):
        return view
    document = _document(action.payload)
    payload = canonical_json(MASK if document is None else mask_any_payload(document))
    return msgspec.structs.replace(view, body=codec.encode_command(msgspec.structs.replace(action, payload=payload)))


def _masked_text(text: str) -> str:
    """A payload an audit entry or an event holds as JSON text (or a SHA-256 of a large one)."""
    document = _document(text.encode())
    if document is None:
        return text
    return json.dumps(mask_any_payload(document), separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def masked_detail(detail: Any) -> Any:
    """An entry's before or after, or an event's data: a `payload` in it masked."""
    if not isinstance(detail, dict):
        return detail
    return {key: _masked_text(value) if key == "payload" and isinstance(value, str) else value
            for key, value in detail.items()}  # fmt: skip


def masked_entry(entry: AuditEntry) -> AuditEntry:
    def side(text: str) -> str:
        try:
            document = json.loads(text)
        except ValueError:
            return text
        return json.dumps(masked_detail(document), separators=(",", ":"), sort_keys=True, ensure_ascii=False)

    return msgspec.structs.replace(entry, before=side(entry.before), after=side(entry.after))


def masked_event(event: Event) -> Event:
    return msgspec.structs.replace(event, data=masked_detail(event.data))


Masker = Callable[[Any], Any]
MASKED: Final[Mapping[type[Any], Masker]] = {
    qc.MessagesAnswer: lambda a: msgspec.structs.replace(a, messages=tuple(map(masked_view, a.messages))),
    qc.DeadLettersAnswer: lambda a: msgspec.structs.replace(a, items=tuple(map(masked_view, a.items))),
    qc.ProposalsAnswer: lambda a: msgspec.structs.replace(a, proposals=tuple(map(masked_proposal, a.proposals))),
    qc.AuditAnswer: lambda a: msgspec.structs.replace(a, entries=tuple(map(masked_entry, a.entries))),
    qc.MessageEventsAnswer: lambda a: msgspec.structs.replace(a, events=tuple(map(masked_event, a.events))),
    qc.EventsAnswer: lambda a: msgspec.structs.replace(a, events=tuple(map(masked_event, a.events))),
}
"""The answers that hold payloads, and how each is masked."""
PASSED: Final = frozenset({
    qc.DeadLetterSummaryAnswer, qc.CountsAnswer, qc.OldestDueAnswer, qc.RetentionAnswer, qc.DigestAnswer,
    qc.ScrubAnswer, qc.KindsAnswer, qc.TokensAnswer, qc.WorkDueAnswer, qc.MaintenanceDueAnswer, qc.DocumentsAnswer,
    qc.JobsAnswer, qc.JobItemsAnswer, qc.QueryError,
})  # fmt: skip
"""The answers that hold no payload and no personal value: passed as they are."""


def masked_answer(answer: qc.QueryAnswer) -> qc.QueryAnswer:
    masker = MASKED.get(type(answer))
    if masker is not None:
        masked: qc.QueryAnswer = masker(answer)
        return masked
    if type(answer) not in PASSED:
        raise QueueError(f"{type(answer).__name__} is not classified for masking (api/masked_reads.py)")
    return answer


def _chain(view: MessageView, known: Mapping[int, MessageView]) -> list[MessageView]:
    """The versions of `view` that were read, both ways."""
    chain = [view]
    for step in ("previous_id", "superseded_by"):
        current = view
        for _ in range(VERSIONS_MAX):
            link = getattr(current, step)
            if link is None or link not in known:
                break
            current = known[link]
            chain.append(current)
    return chain


class MaskedQueueClient(QueueClient):
    """The same store, read masked, never written."""

    def __init__(self, queue: QueueClient) -> None:
        super().__init__(queue.raft, reader=queue.reader, coalesce=False)

    async def query(self, query: qc.QueueQuery, *, stale_ok: bool = False) -> Read[qc.QueryAnswer]:
        read = await super().query(query, stale_ok=stale_ok)
        answer = read.value
        if isinstance(answer, qc.MessagesAnswer | qc.DeadLettersAnswer):
            field = "messages" if isinstance(answer, qc.MessagesAnswer) else "items"
            views: tuple[MessageView, ...] = getattr(answer, field)
            versions = await self._versions(views, stale_ok)
            masked = tuple(masked_view(view, versions.get(view.message_id)) for view in views)
            return Read(msgspec.structs.replace(answer, **{field: masked}), read.applied_index, read.now_ms)
        return Read(masked_answer(answer), read.applied_index, read.now_ms)

    async def _versions(self, views: Sequence[MessageView], stale_ok: bool) -> dict[int, dict[str, str]]:
        """For each edited message, the personal values of its other versions: an edit keeps the
        original's headers (the producer's failure text, which may name the old account) on a new
        version whose payload no longer holds it. Read unmasked, here only, at most VERSIONS_MAX
        versions each way."""
        known = {view.message_id: view for view in views}
        wanted = {link for view in views for link in (view.previous_id, view.superseded_by) if link is not None}
        for _ in range(VERSIONS_MAX):
            wanted -= known.keys()
            if not wanted:
                break
            asked = qc.GetMessages(ids=tuple(sorted(wanted)), with_history=False)
            found = await super().query(asked, stale_ok=stale_ok)
            if not isinstance(found.value, qc.MessagesAnswer):
                break
            known.update((view.message_id, view) for view in found.value.messages)
            wanted = {link for view in found.value.messages for link in (view.previous_id, view.superseded_by)
                      if link is not None}  # fmt: skip
        values: dict[int, dict[str, str]] = {}
        for view in views:
            if view.previous_id is None and view.superseded_by is None:
                continue
            values[view.message_id] = personal_values(
                view.kind, (payload for other in _chain(view, known) for payload in (other.payload, other.edited_payload))
            )
        return values

    async def submit(self, command: QueueCommand) -> QueueResult:
        raise QueueError("a caller without personal-data rights reads through this client, and writes nothing")

    async def submit_many(self, commands: Sequence[QueueCommand]) -> list[QueueResult]:
        raise QueueError("a caller without personal-data rights reads through this client, and writes nothing")
