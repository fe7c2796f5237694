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

These four values are masked wherever they are in an answer (`masked_answer` walks it), so a new
answer that carries them is masked without anyone listing it; every other value the store answers
holds no personal data (counts, summaries, jobs and their items, kinds, policies, documents of the
API's own namespaces, token hashes), and tests/api/test_masked_reads.py fails when a new one holds
a payload-like field nobody decided about.

Must never: write to the store (a viewer changes nothing; a write through this client raises), or
read it other than through `QueueClient`'s public reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import msgspec

from ledger.kinds import canonical_json
from ledger.masking import MASK, mask_any_payload, mask_identifier, mask_payload
from queues import (
    AuditEntry,
    EditRedrive,
    Event,
    LongPoll,
    MessageView,
    ProposalView,
    QueueClient,
    QueueError,
    Read,
    proposal_action,
    proposal_with_action,
)

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
    action = proposal_action(view)
    if not isinstance(action, EditRedrive):
        return view
    document = _document(action.payload)
    payload = canonical_json(MASK if document is None else mask_any_payload(document))
    return proposal_with_action(view, msgspec.structs.replace(action, payload=payload))


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


MASKED_TYPES: Final = (MessageView, ProposalView, AuditEntry, Event)
"""The values of the store's answers that hold payloads: each masked wherever it is in an answer."""


def masked_answer(answer: Any, versions: Mapping[int, Mapping[str, str]] | None = None) -> Any:
    """Any answer of the store with every value that holds a payload masked, wherever it is in it
    (a new answer that carries messages is masked without anyone listing it); `versions`: each
    edited message's other versions' personal values."""
    if isinstance(answer, MessageView):
        return masked_view(answer, (versions or {}).get(answer.message_id))
    if isinstance(answer, ProposalView):
        return masked_proposal(answer)
    if isinstance(answer, AuditEntry):
        return masked_entry(answer)
    if isinstance(answer, Event):
        return masked_event(answer)
    if isinstance(answer, tuple | list):
        items = [masked_answer(item, versions) for item in answer]
        return answer if all(a is b for a, b in zip(items, answer, strict=True)) else type(answer)(items)
    if isinstance(answer, msgspec.Struct):
        changed = {}
        for name in answer.__struct_fields__:
            value = getattr(answer, name)
            masked = masked_answer(value, versions)
            if masked is not value:
                changed[name] = masked
        return msgspec.structs.replace(answer, **changed) if changed else answer
    return answer


def messages_in(answer: Any) -> Iterator[MessageView]:
    if isinstance(answer, MessageView):
        yield answer
    elif isinstance(answer, tuple | list):
        for item in answer:
            yield from messages_in(item)
    elif isinstance(answer, msgspec.Struct):
        for name in answer.__struct_fields__:
            yield from messages_in(getattr(answer, name))


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
        self._plain = queue

    async def query(self, query: Any, *, stale_ok: bool = False, wait: LongPoll | None = None) -> Read[Any]:
        read = await super().query(query, stale_ok=stale_ok, wait=wait)
        views = list(messages_in(read.value))
        versions = await self._versions(views, stale_ok) if views else {}
        return Read(masked_answer(read.value, versions), read.applied_index, read.now_ms)

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
            found = (await self._plain.get_many(sorted(wanted), with_history=False, stale_ok=stale_ok)).value
            known.update((view.message_id, view) for view in found)
            wanted = {link for view in found for link in (view.previous_id, view.superseded_by) if link is not None}
        values: dict[int, dict[str, str]] = {}
        for view in views:
            if view.previous_id is None and view.superseded_by is None:
                continue
            values[view.message_id] = personal_values(
                view.kind, (payload for other in _chain(view, known) for payload in (other.payload, other.edited_payload))
            )
        return values

    async def submit(self, command: Any) -> Any:
        raise QueueError("a caller without personal-data rights reads through this client, and writes nothing")

    async def submit_many(self, commands: Sequence[Any]) -> list[Any]:
        raise QueueError("a caller without personal-data rights reads through this client, and writes nothing")
