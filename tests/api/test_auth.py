"""Authentication and roles: every endpoint x every role, tokens that come and go, and secrets
that never reach a log."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
from api_support import Api, put_tokens, running_api, transfer

from api.auth import MISS_REFRESH_MIN_S
from api.tokens import new_token, token_hash
from queues import QueueClient, RaftClient, Role
from raft_store.testing.inprocess import StoreThread

P, OP, R, A, V, ADMIN = Role.PRODUCER, Role.OPERATOR, Role.REVIEWER, Role.APPROVER, Role.VIEWER, Role.ADMIN
POLICY = {"tiers_ms": [1000, 5000], "tier_jitter_ratio": 0.1, "attempts_max": 5}

# (method, path, body, roles allowed besides admin). None: no token needed.
MATRIX: list[tuple[str, str, dict[str, Any] | None, frozenset[Role] | None]] = [
    ("POST", "/v1/requests", transfer("m"), frozenset({P})),
    ("POST", "/v1/requests:batch", {"items": [{"idempotency_key": "mb", "request": transfer("mb")}]}, frozenset({P})),
    ("GET", "/v1/requests/{id}", None, frozenset({P, OP, R, A, V})),
    ("GET", "/v1/refs/rp-m/timeline", None, frozenset({P, OP, R, A, V})),
    ("GET", "/v1/kinds", None, frozenset({OP, R, A, V})),
    ("GET", "/v1/kinds/transfer", None, frozenset({OP, R, A, V})),
    ("GET", "/v1/kinds/transfer/policy", None, frozenset({OP, R, A, V})),
    ("PUT", "/v1/kinds/transfer/policy", POLICY, frozenset({OP})),
    ("POST", "/v1/kinds/transfer/pause", {"reason": "matrix"}, frozenset({OP})),
    ("POST", "/v1/kinds/transfer/resume", {}, frozenset({OP})),
    ("GET", "/metrics", None, frozenset({OP})),
    ("GET", "/v1/breakers", None, frozenset({OP, R, A, V})),
    ("PUT", "/v1/breakers/payment", {"mode": "auto", "reason": "matrix"}, frozenset({OP})),
    ("GET", "/v1/downstreams/payment/classification", None, frozenset({OP, R, A, V})),
    ("PUT", "/v1/downstreams/payment/classification", {"downstream": "payment", "rules": []}, frozenset({OP})),
    ("DELETE", "/v1/downstreams/payment/classification", None, frozenset({OP})),
    ("GET", "/v1/retention", None, frozenset({OP, R, A, V})),
    ("PUT", "/v1/retention", {"retention_ms": 8 * 86_400_000, "reason": "matrix"}, frozenset()),
    ("GET", "/healthz", None, None),
    ("GET", "/readyz", None, None),
    ("GET", "/openapi.json", None, None),
    ("GET", "/problems/not-found", None, None),
]  # fmt: skip


async def _call(api: Api, method: str, path: str, body: dict[str, Any] | None, token: str | None) -> httpx.Response:
    headers = {"Idempotency-Key": "matrix"} if body is not None else {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return await api.client.request(method, path, json=body, headers=headers)


async def test_every_endpoint_by_every_role(api: Api) -> None:
    created = await api.client.post("/v1/requests", json=transfer("m"), headers={**api.auth(), "Idempotency-Key": "m0"})
    request_id = created.json()["id"]
    outcomes: dict[tuple[str, str, str], int] = {}
    for method, template, body, allowed in MATRIX:
        path = template.format(id=request_id)
        callers: list[tuple[str, str | None]] = [("none", None), ("forged", new_token())]
        callers += [(role.value, api.tokens[role]) for role in Role]
        for name, token in callers:
            status = (await _call(api, method, path, body, token)).status_code
            outcomes[(method, template, name)] = status
            if allowed is None:
                assert status < 400, (method, path, name, status)
            elif name in ("none", "forged"):
                assert status == 401, (method, path, name, status)
            elif Role(name) in allowed or Role(name) is ADMIN:
                assert status not in (401, 403) and status < 500, (method, path, name, status)
            else:
                assert status == 403, (method, path, name, status)
    assert len(outcomes) == len(MATRIX) * (len(Role) + 2)


async def test_problems_tell_401_from_403(api: Api) -> None:
    missing = await api.client.get("/v1/kinds")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == 'Bearer realm="compensator"'
    wrong = await api.client.get("/v1/kinds", headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert wrong.status_code == 401
    forged = await api.client.get("/v1/kinds", headers={"Authorization": f"Bearer {new_token()}"})
    assert forged.status_code == 401 and 'error="invalid_token"' in forged.headers["www-authenticate"]
    refused = await api.client.get("/v1/kinds", headers=api.auth(P))
    assert refused.status_code == 403 and "operator" in refused.json()["detail"]


async def test_a_revoked_token_stops_and_a_new_one_starts_within_the_refresh(store: StoreThread) -> None:
    async with running_api(store) as api:
        queue = QueueClient(RaftClient([store.address], auth=store.auth))
        try:
            assert (await api.client.get("/v1/kinds", headers=api.auth(OP))).status_code == 200
            await queue.revoke_token("operator", actor="tests", reason="leaked")
            await asyncio.sleep(0.5)  # the refresh interval of these tests is 0.2 s
            assert (await api.client.get("/v1/kinds", headers=api.auth(OP))).status_code == 401
            fresh = new_token()
            await queue.put_token("operator", OP, token_hash(fresh), actor="tests")
            # at once: an unknown token makes the cache ask the store
            answer = await api.client.get("/v1/kinds", headers={"Authorization": f"Bearer {fresh}"})
            assert answer.status_code == 200
        finally:
            await queue.raft.close()


async def test_unknown_tokens_cost_the_store_a_bounded_number_of_reads(api: Api) -> None:
    tokens = api.app.state.services.tokens
    before = tokens.version
    reads = 0
    original = api.queue.tokens

    counted = api.app.state.services.queue
    real = counted.tokens

    async def counting(**kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await real(**kwargs)

    counted.tokens = counting
    try:
        started = asyncio.get_running_loop().time()
        answers = await asyncio.gather(*(api.client.get("/v1/kinds", headers={"Authorization": f"Bearer {new_token()}"})
                                         for _ in range(200)))  # fmt: skip
        elapsed = asyncio.get_running_loop().time() - started
        malformed = await api.client.get("/v1/kinds", headers={"Authorization": "Bearer not-a-token"})
    finally:
        counted.tokens = real
    assert {a.status_code for a in answers} == {401} and malformed.status_code == 401
    assert reads <= 2 + elapsed / MISS_REFRESH_MIN_S + elapsed / 0.2, (reads, elapsed)
    assert tokens.version == before and original is not None


async def test_tokens_never_reach_a_log(store: StoreThread, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with running_api(store) as api:
        for role in Role:
            await api.client.post("/v1/requests", json=transfer(), headers={**api.auth(role), "Idempotency-Key": "x"})
            await api.client.get("/v1/kinds", headers=api.auth(role))
        await api.client.get("/v1/kinds", headers={"Authorization": f"Bearer {new_token()}"})
        extra = await put_tokens(store, (P,), prefix="late-")
        await api.client.get("/v1/kinds", headers={"Authorization": f"Bearer {extra[P]}"})
        secrets = [*api.tokens.values(), *extra.values()]
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert logged, "nothing was logged: the check would be empty"
    for secret in secrets:
        assert secret not in logged and secret[4:20] not in logged
