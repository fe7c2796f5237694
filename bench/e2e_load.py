"""The end-to-end benchmark's producer: the requests it submits, and the client that POSTs them.

Owns:
- `submission`: request `index` of a run as a producer would send it, deterministic in
  (nonce, index): its kind by the mix (interleaved, so every stretch of the run has the same
  mix), its Idempotency-Key, and the effect it must leave downstream (a transfer id, a receive-list
  entry, a callback's key);
- `batch_bodies`: the `:batch` bodies, encoded before the measured window opens;
- `post_all`: the batches, `in_flight` at a time, each batch sent no sooner than the pacing allows
  (`rate_per_s`, 0: as fast as the API answers); a batch that fails as a whole, and an item
  answered 503, are sent again with the same keys, as a producer must.

Must never: count an item as acknowledged unless the API answered it 201 (or 200, a replay of a
key whose first answer was lost), or send one key with two bodies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import msgspec

from ledger.kinds import Kind
from ledger.request_ids import RequestId

MIX_DEFAULT: Final = ((Kind.TRANSFER, 7), (Kind.LIST_UPDATE, 2), (Kind.CALLBACK, 1))
"""Seven transfers, two receive-list updates and one merchant callback in every ten requests."""
POST_TRIES_MAX: Final = 5
"""Sends of one batch (or of one item answered 503) before the bench gives up on it."""
RETRY_PAUSE_S: Final = 0.2
POST_TIMEOUT_S: Final = 30.0
ACKNOWLEDGED: Final = frozenset({200, 201})
PAYER: Final = "red-packet-escrow"
ACCOUNTS: Final = 997
"""Payees and receivers cycle through this many user ids."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Planned:
    """One request of the run and the effect it must leave downstream, exactly once."""

    index: int
    kind: Kind
    key: str
    """The producer's Idempotency-Key."""
    effect: str
    """transfer: the transfer id; list_update: "red_packet_id/receiver/version"; callback: the key."""
    request: dict[str, Any]


def kind_at(index: int, mix: Sequence[tuple[Kind, int]]) -> Kind:
    """The kind of request `index`: the mix's weights laid out in turn, over and over."""
    slot = index % sum(weight for _, weight in mix)
    for kind, weight in mix:
        if slot < weight:
            return kind
        slot -= weight
    raise AssertionError("unreachable: slot is below the sum of the weights")


def submission(index: int, *, nonce: str, mix: Sequence[tuple[Kind, int]], callback_target: str) -> Planned:
    kind = kind_at(index, mix)
    key = f"{nonce}-{index:07d}"
    ref_key = f"rp-{nonce}-{index // 10}"
    user = f"user-{index % ACCOUNTS}"
    amount_minor = 100 + index % 900
    failure = {"error_class": "timeout", "text": "the call did not answer in time", "http_status": 504}
    payload: dict[str, Any]
    if kind is Kind.TRANSFER:
        effect = f"tr-{nonce}-{index}"
        payload = {"transfer_id": effect, "payer": PAYER, "payee": user, "amount_minor": amount_minor,
                   "currency": "CNY", "memo": f"red packet {ref_key}"}  # fmt: skip
    elif kind is Kind.LIST_UPDATE:
        packet, version = f"rp-{nonce}-{index}", 1 + index % 3
        effect = f"{packet}/{user}/{version}"
        payload = {"red_packet_id": packet, "receiver": user, "version": version, "amount_minor": amount_minor,
                   "currency": "CNY"}  # fmt: skip
    else:
        effect = key
        payload = {"target": callback_target,
                   "body": {"event": "red_packet.granted", "red_packet_id": ref_key, "sequence": index}}  # fmt: skip
    request = {"kind": kind.value, "ref_key": ref_key, "payload": payload, "failure": failure}
    return Planned(index=index, kind=kind, key=key, effect=effect, request=request)


def batch_bodies(planned: Sequence[Planned], batch_size: int) -> list[tuple[list[Planned], bytes]]:
    """The batches in order, each with its encoded `:batch` body."""
    batches = []
    for start in range(0, len(planned), batch_size):
        items = list(planned[start : start + batch_size])
        body = msgspec.json.encode({"items": [{"idempotency_key": p.key, "request": p.request} for p in items]})
        batches.append((items, body))
    return batches


@dataclass
class Posted:
    """What the API answered, filled in as the answers come."""

    acknowledged: dict[RequestId, Planned] = field(default_factory=dict)
    """By request id (its set and message id)."""
    answered_ms: dict[RequestId, int] = field(default_factory=dict)
    """By request id: the wall clock when the item's acknowledgement arrived."""
    replays: int = 0
    retried_items: int = 0
    retried_batches: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    """Items given up on, by their last status ("transport" for a batch that never got an answer)."""
    first_refusal: str = ""
    batch_latencies_s: list[float] = field(default_factory=list)
    first_post_ms: int = 0
    last_answer_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Client:
    http: httpx.AsyncClient
    token: str
    rate_per_s: float
    in_flight: int


async def post_all(client: Client, batches: Sequence[tuple[list[Planned], bytes]], posted: Posted) -> None:
    """Every batch, `in_flight` at a time; batch k starts no sooner than k * size / rate after the first."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for number in range(len(batches)):
        queue.put_nowait(number)
    started_s = time.perf_counter()
    posted.first_post_ms = time.time_ns() // 1_000_000

    async def sender() -> None:
        while not queue.empty():
            number = queue.get_nowait()
            items, body = batches[number]
            if client.rate_per_s > 0:
                due_s = started_s + number * len(items) / client.rate_per_s
                await asyncio.sleep(max(0.0, due_s - time.perf_counter()))
            await _post_batch(client, items, body, posted)

    await asyncio.gather(*(sender() for _ in range(client.in_flight)))


async def _post_batch(client: Client, items: list[Planned], body: bytes, posted: Posted) -> None:
    pending = {p.key: p for p in items}
    for attempt in range(POST_TRIES_MAX):
        if attempt:
            await asyncio.sleep(RETRY_PAUSE_S)
            body = batch_bodies(list(pending.values()), len(pending))[0][1]
        answers = await _send(client, body, posted)
        if answers is None:
            posted.retried_batches += 1
            continue
        for planned, answer in zip(list(pending.values()), answers, strict=True):
            status = int(answer["status"])
            if status in ACKNOWLEDGED:
                _acknowledge(planned, answer, posted)
                del pending[planned.key]
            elif status != 503:  # anything but "try again" is the bench's own mistake
                _refuse(posted, str(status), answer, 1)
                del pending[planned.key]
        if not pending:
            return
        posted.retried_items += len(pending)
    _refuse(posted, "gave_up", {"after_tries": POST_TRIES_MAX}, len(pending))


async def _send(client: Client, body: bytes, posted: Posted) -> list[dict[str, Any]] | None:
    """The items' answers, or None when the batch as a whole failed (send it again)."""
    headers = {"authorization": f"Bearer {client.token}", "content-type": "application/json"}
    sent_s = time.perf_counter()
    try:
        answer = await client.http.post("/v1/requests:batch", content=body, headers=headers)
    except httpx.HTTPError as error:
        posted.first_refusal = posted.first_refusal or f"transport: {type(error).__name__}: {error}"[:300]
        return None
    posted.batch_latencies_s.append(time.perf_counter() - sent_s)
    posted.last_answer_ms = time.time_ns() // 1_000_000
    if answer.status_code != 200:
        posted.first_refusal = posted.first_refusal or f"batch answered {answer.status_code}: {answer.text[:300]}"
        return None
    items: list[dict[str, Any]] = msgspec.json.decode(answer.content)["items"]
    return items


def _acknowledge(planned: Planned, answer: dict[str, Any], posted: Posted) -> None:
    public = RequestId.parse(str(answer["request"]["id"]))
    assert public is not None, f"the API answered an id it could not have issued: {answer}"
    posted.acknowledged[public] = planned
    posted.answered_ms[public] = time.time_ns() // 1_000_000
    posted.replays += int(answer["status"]) == 200


def _refuse(posted: Posted, reason: str, detail: dict[str, Any], count: int) -> None:
    posted.refused[reason] = posted.refused.get(reason, 0) + count
    posted.first_refusal = posted.first_refusal or f"{reason}: {msgspec.json.encode(detail).decode()[:300]}"
