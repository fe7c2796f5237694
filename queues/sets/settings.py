"""Cluster-wide settings over many sets: written to every set, recorded as intended in the control
set, and repaired where a set missed them (docs/sets.md, "What is cluster-wide, and where").

    setting = Pause(kind="transfer", holder="ops:alice", reason="payment outage")
    outcome = await sets.broadcast(setting, actor="alice")   # the facade: intent, then every set
    outcome.unreachable                                       # [] or the sets the call must be repeated for
    await sets.repair_settings()                              # bring every set in line with the intent

A pause, a retry policy, a retention, a breaker's mode or a classification table is decided by each
set's machine at apply time (a lease skips a paused kind, a fail follows the kind's policy), and a
deterministic core cannot read another group while it applies: so each set holds the value in its
own log, and a write of one is a write to every set. The control set holds the **intent**: one
document per setting (namespace `settings`, named by what it sets: `pause/transfer/ops:alice`,
`policy/transfer`, `document/breakers/payment`, `retention/retention_ms`), written first, so a
write that reached some sets only is finished by `repair` without anyone repeating it, and a set
added later is given every intended setting before its epoch becomes active.

Each set's write is idempotent (a pause its holder already holds, a resume of a holder that holds
nothing, the same policy or document again change nothing that matters), so repeating a call, or a
repair racing an operator, is safe. A breaker's own pauses (holder `breaker:<downstream>`) are the
workers' to hold and release (services/worker/breaker_board.py): they are fanned out like any pause
but never recorded as intent, so a repair never fights a breaker.

Must never: answer a write as done when a set did not apply it, or repair a setting no intent
names (what was set before intents existed, a breaker's pause).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import msgspec

from delay.policy import RetryPolicy
from queues.client import QueueClient
from queues.client_reads import QueueError
from queues.model import TEXT_LENGTH_MAX, Code, DocumentResult, KindResult, QueueResult, RetentionResult
from raft_store.client import ClientError

log = logging.getLogger("queues.sets")

NAMESPACE: Final = "settings"
"""The control set's namespace of intended settings."""
REPAIR_ACTOR: Final = "system:settings-repair"
BREAKER_HOLDER_PREFIX: Final = "breaker:"
ABSENCE_KEEP_MS: Final = 24 * 60 * 60 * 1000
"""How long an intent that records an absence (a resume, a document's reset) is kept at least, by
the control set's clock, before `prune` may delete it: far longer than a write still in flight can
take to land (a client gives up within seconds, `store.deadline_s`), so no late pause or document
can reach a set after the intent that would have repaired it is gone."""


class _Setting(msgspec.Struct, frozen=True, kw_only=True, tag_field="setting"):
    actor: str = ""
    """Who asked for it (the intent's record; each set's audit entry names the writer)."""
    reason: str = ""


class Pause(_Setting, frozen=True, tag="pause"):
    kind: str
    holder: str


class Resume(_Setting, frozen=True, tag="resume"):
    kind: str
    holder: str


class Policy(_Setting, frozen=True, tag="policy"):
    kind: str
    policy: RetryPolicy


class Document(_Setting, frozen=True, tag="document"):
    """A settings document (breakers, classification), or its removal (`body` None)."""

    namespace: str
    name: str
    body: bytes | None


class Retention(_Setting, frozen=True, tag="retention"):
    retention_ms: int | None = None
    event_retention_ms: int | None = None


Setting = Pause | Resume | Policy | Document | Retention
_codec_encoder: Final = msgspec.json.Encoder()
_codec_decoder: Final = msgspec.json.Decoder(Setting)


def intents(setting: Setting) -> list[tuple[str, Setting]]:
    """The intent documents this setting writes in the control set: (name, the setting it holds).
    A pause and its resume share a name (the last one is the intent); a breaker's holder has none."""
    match setting:
        case Pause() | Resume():
            if setting.holder.startswith(BREAKER_HOLDER_PREFIX):
                return []
            return [(f"pause/{setting.kind}/{setting.holder}", setting)]
        case Policy():
            return [(f"policy/{setting.kind}", setting)]
        case Document():
            return [(f"document/{setting.namespace}/{setting.name}", setting)]
        case Retention():
            found: list[tuple[str, Setting]] = []
            if setting.retention_ms is not None:
                found.append(("retention/retention_ms", msgspec.structs.replace(setting, event_retention_ms=None)))
            if setting.event_retention_ms is not None:
                found.append(("retention/event_retention_ms", msgspec.structs.replace(setting, retention_ms=None)))
            return found


async def apply(queue: QueueClient, setting: Setting, *, actor: str) -> QueueResult:
    """The setting written to one set, audited there with `actor`."""
    match setting:
        case Pause():
            return await queue.pause(setting.kind, setting.holder, setting.reason, actor=actor)
        case Resume():
            return await queue.resume(setting.kind, setting.holder, actor=actor)
        case Policy():
            return await queue.set_policy(setting.kind, setting.policy, actor=actor, reason=setting.reason)
        case Document():
            return await queue.put_document(setting.namespace, setting.name, setting.body, actor=actor,
                                            reason=setting.reason)  # fmt: skip
        case Retention():
            return await queue.set_retention(actor=actor, reason=setting.reason, retention_ms=setting.retention_ms,
                                             event_retention_ms=setting.event_retention_ms)  # fmt: skip


def settled(setting: Setting, result: QueueResult) -> bool | None:
    """True: the set applied it now; False: it already held it (the idempotent repeat); None: it
    refused (the result says why)."""
    code = getattr(result, "code", None)
    if code is Code.OK and isinstance(result, KindResult | DocumentResult | RetentionResult):
        return True
    if isinstance(setting, Pause) and code is Code.ALREADY_PAUSED:
        return False
    if isinstance(setting, Resume) and code is Code.NOT_PAUSED:
        return False
    return None


@dataclass(frozen=True, slots=True)
class BroadcastOutcome:
    """A broadcast's answer from every set of the table, in set order."""

    setting: Setting
    results: dict[int, QueueResult | ClientError | QueueError] = field(default_factory=dict)

    @property
    def applied(self) -> list[int]:
        """Sets that hold the setting now (applied by this call, or held already)."""
        return [s for s, r in sorted(self.results.items()) if not isinstance(r, Exception) and settled(self.setting, r) is not None]

    @property
    def unreachable(self) -> list[int]:
        """Sets that did not answer (no leader, no majority, a lost answer): repeat the call."""
        return [s for s, r in sorted(self.results.items()) if isinstance(r, ClientError)]

    @property
    def refused(self) -> dict[int, QueueResult | QueueError]:
        """Sets that answered with a refusal (an unknown kind, an invalid value)."""
        return {s: r for s, r in sorted(self.results.items())
                if not isinstance(r, ClientError) and (isinstance(r, QueueError) or settled(self.setting, r) is None)}  # fmt: skip

    @property
    def already(self) -> bool:
        """Every set answered that it already held the setting (a pause held twice: the caller's 409)."""
        return bool(self.results) and all(
            not isinstance(r, Exception) and settled(self.setting, r) is False for r in self.results.values()
        )

    def first(self) -> QueueResult | None:
        """The lowest-numbered set's answer, when it answered (what a one-set store would say)."""
        for _, result in sorted(self.results.items()):
            if not isinstance(result, Exception):
                return result
        return None

    def summary(self) -> str:
        applied = ",".join(map(str, self.applied)) or "none"
        missed = ",".join(map(str, self.unreachable)) or "none"
        return f"applied in sets {applied}; not applied in sets {missed} (they did not answer)"


class IntentUnavailable(Exception):
    """The control set did not take the intent: nothing was written to any set. `refused`: it
    answered with a refusal (a repeat will not help: its namespace is full), else it did not answer."""

    def __init__(self, error: ClientError | QueueError, *, refused: bool = False) -> None:
        super().__init__(f"the control set did not record the setting, so no set was changed: {error}")
        self.error = error
        self.refused = refused


async def record(control: QueueClient, setting: Setting, *, actor: str) -> None:
    """Write the setting's intent to the control set (IntentUnavailable when it cannot)."""
    for name, intended in intents(setting):
        body = _codec_encoder.encode(msgspec.structs.replace(intended, actor=actor))
        try:
            result = await control.put_document(NAMESPACE, name, body, actor=actor, reason=_text(setting.reason))
        except (ClientError, QueueError) as error:
            raise IntentUnavailable(error) from None
        if result.code is not Code.OK:
            raise IntentUnavailable(QueueError(
                f"it refused the intent {name} ({result.code.name}; its namespace {NAMESPACE!r} holds at most 1000"
                " settings; a resume's or a reset's intent is deleted a day after every set holds it: see"
                " docs/sets.md, 'Writing a cluster-wide setting')"), refused=True)  # fmt: skip


async def broadcast(
    control: QueueClient | None, clients: Mapping[int, QueueClient], setting: Setting, *, actor: str
) -> BroadcastOutcome:
    """Record the intent (when there is a control set), then write the setting to every set,
    concurrently: each set's call is bounded by its own client's deadline, so a set that is down
    costs one deadline, not one per set, and delays no other set's write."""
    if control is not None:
        await record(control, setting, actor=actor)
    ids = sorted(clients)
    answers = await asyncio.gather(*(apply(clients[s], setting, actor=actor) for s in ids), return_exceptions=True)
    outcome = BroadcastOutcome(setting)
    for set_id, answer in zip(ids, answers, strict=True):
        if isinstance(answer, ClientError | QueueError) or not isinstance(answer, BaseException):
            outcome.results[set_id] = answer
        else:
            raise answer
    return outcome


async def intended(control: QueueClient) -> tuple[list[Setting], int]:
    """Every intended setting the control set records, and the namespace's version."""
    answer = (await control.documents(NAMESPACE)).value
    found: list[Setting] = []
    for document in answer.documents:
        try:
            found.append(_codec_decoder.decode(document.body))
        except msgspec.DecodeError as error:
            log.error("the intended setting %s in the control set cannot be read; left alone: %s", document.name, error)
    return found, answer.version


async def drift(queue: QueueClient, wanted: Sequence[Setting]) -> list[Setting]:
    """The intended settings this set does not hold (linearizable reads of its kinds, retention and
    the documents' namespaces concerned)."""
    kinds = {view.kind: view for view in (await queue.kinds()).value}
    namespaces = sorted({s.namespace for s in wanted if isinstance(s, Document)})
    documents = {ns: {d.name: d.body for d in (await queue.documents(ns)).value.documents} for ns in namespaces}
    retention = (await queue.retention()).value if any(isinstance(s, Retention) for s in wanted) else None
    missing: list[Setting] = []
    for setting in wanted:
        match setting:
            case Pause() | Resume():
                view = kinds.get(setting.kind)
                held = view is not None and any(p.holder == setting.holder for p in view.pauses)
                if view is not None and held != isinstance(setting, Pause):
                    missing.append(setting)
            case Policy():
                view = kinds.get(setting.kind)
                if view is not None and view.policy != setting.policy:
                    missing.append(setting)
            case Document():
                if documents[setting.namespace].get(setting.name) != setting.body:
                    missing.append(setting)
            case Retention():
                assert retention is not None
                if (setting.retention_ms not in (None, retention.retention_ms)
                        or setting.event_retention_ms not in (None, retention.event_retention_ms)):  # fmt: skip
                    missing.append(setting)
    return missing


async def held(queue: QueueClient, namespaces: Sequence[str]) -> list[Setting]:
    """What one set holds of the cluster-wide settings: its operators' pauses (never a breaker's),
    every kind's policy, the documents of these namespaces and its retention, as settings."""
    found: list[Setting] = []
    for view in (await queue.kinds()).value:
        found += [Pause(kind=view.kind, holder=p.holder, reason=p.reason) for p in view.pauses
                  if not p.holder.startswith(BREAKER_HOLDER_PREFIX)]  # fmt: skip
        found.append(Policy(kind=view.kind, policy=view.policy))
    for namespace in namespaces:
        for document in (await queue.documents(namespace)).value.documents:
            found.append(Document(namespace=namespace, name=document.name, body=document.body,
                                  reason=f"adopted: {document.name} as set by {document.updated_by}"))  # fmt: skip
    retention = (await queue.retention()).value
    found.append(Retention(retention_ms=retention.retention_ms, event_retention_ms=retention.event_retention_ms))
    return found


async def adopt(control: QueueClient, queue: QueueClient, namespaces: Sequence[str], *, actor: str,
                reason: str) -> list[str]:  # fmt: skip
    """Record as intended what this set holds and no intent names yet (the names adopted): for a
    deployment whose settings were written before intents existed, so that the repair gives the
    other sets what this one holds. An existing intent is never replaced (it is newer than
    anything written before intents existed)."""
    wanted, _ = await intended(control)
    known = {name for setting in wanted for name, _ in intents(setting)}
    adopted: list[str] = []
    for setting in await held(queue, namespaces):
        fresh = [name for name, _ in intents(setting) if name not in known]
        if not fresh:
            continue
        why = f"{reason}: {setting.reason}" if setting.reason else reason
        await record(control, msgspec.structs.replace(setting, reason=_text(why)), actor=actor)
        adopted += fresh
    return adopted


async def repair(control: QueueClient, clients: Mapping[int, QueueClient]) -> dict[int, list[Setting] | Exception]:
    """Bring every set in line with the intended settings: per set, what was re-applied (as
    REPAIR_ACTOR, the reason naming who intended it), or the error that stopped it (that set is
    tried again by the next pass). A set's writes are skipped for this pass when the intent changed
    while it was being compared (an operator's write is under way: its own fan-out covers it)."""
    wanted, version = await intended(control)
    if not wanted:
        return {}

    async def one(set_id: int) -> list[Setting]:
        queue = clients[set_id]
        missing = await drift(queue, wanted)
        if not missing or (await control.documents(NAMESPACE, known_version=version)).value.changed:
            return []
        for setting in missing:
            reason = _text(f"repair: set {set_id} missed this setting of {setting.actor or 'an operator'}: {setting.reason}")
            result = await apply(queue, msgspec.structs.replace(setting, reason=reason), actor=REPAIR_ACTOR)
            if settled(setting, result) is None:
                log.warning("set %d refused the repair of %r: %r", set_id, setting, result)
        return missing

    ids = sorted(clients)
    done = await asyncio.gather(*(one(s) for s in ids), return_exceptions=True)
    report: dict[int, list[Setting] | Exception] = {}
    for set_id, result in zip(ids, done, strict=True):
        if isinstance(result, ClientError | QueueError):
            report[set_id] = result
        elif isinstance(result, BaseException):
            raise result
        elif result:
            report[set_id] = result
            log.warning("set %d was behind the intended settings; re-applied %d: %s", set_id, len(result),
                        ", ".join(name for s in result for name, _ in intents(s)))  # fmt: skip
    return report


def absence(setting: Setting) -> bool:
    """An intent that only records that something is not set (a resume, a document's reset): once
    every set holds it, it says nothing that a missing intent would not."""
    return isinstance(setting, Resume) or (isinstance(setting, Document) and setting.body is None)


async def prune(
    control: QueueClient | None, clients: Mapping[int, QueueClient], *, keep_ms: int = ABSENCE_KEEP_MS
) -> list[str]:
    """Delete from the control set the intents that record an absence, once older than `keep_ms`
    and held by every set in `clients`, which must be **every set of the table** (a set not
    compared might still hold the pause). The names deleted; an error when a set does not answer
    (nothing is deleted then).

    Without it a resume's intent stayed forever, and the namespace's 1000 documents would fill with
    one per kind and holder ever paused. Each deletion is a compare and set on the namespace's
    version as read before the sets were compared, chained from one to the next: an operator's
    write in the meantime (the same holder paused again) refuses it, and the next pass looks again.
    Each deletion is a `document_put` of the control set, audited there as REPAIR_ACTOR. Without
    a control set (one set) there are no intents, so nothing to prune."""
    if control is None:
        return []
    read = await control.documents(NAMESPACE)
    old: dict[str, Setting] = {}
    for document in read.value.documents:
        if read.now_ms - document.updated_ms < keep_ms:
            continue
        try:
            setting = _codec_decoder.decode(document.body)
        except msgspec.DecodeError:
            continue  # `intended` logs it; never deleted unread
        if absence(setting):
            old[document.name] = setting
    if not old:
        return []
    ids = sorted(clients)
    behind = await asyncio.gather(*(drift(clients[s], list(old.values())) for s in ids))
    held_somewhere = {name for missing in behind for setting in missing for name, _ in intents(setting)}
    version = read.value.version
    pruned: list[str] = []
    for name in sorted(old.keys() - held_somewhere):
        reason = _text(f"prune: every set ({', '.join(map(str, ids))}) holds this absence, recorded {keep_ms // 1000} s ago or more")
        result = await control.put_document(NAMESPACE, name, None, actor=REPAIR_ACTOR, reason=reason,
                                            expected_version=version)  # fmt: skip
        if result.code is not Code.OK:
            break  # the intents changed since they were read: the next pass decides again
        version = result.version
        pruned.append(name)
    if pruned:
        log.info("pruned %d intended absences every set holds: %s", len(pruned), ", ".join(pruned))
    return pruned


def _text(text: str) -> str:
    return text[:TEXT_LENGTH_MAX]
