"""Every error of every operation is an RFC 9457 problem with a status the OpenAPI description
lists for that operation: walked over the description itself (a new operation is walked without
anyone adding it here), with no token, a forged one, a body that is not JSON, one not sent as JSON,
one nested too deep and one too large, and an unknown query parameter."""

from __future__ import annotations

from typing import Any, Final

from api_support import Api

from api.problems import TYPES
from queues import Role

FILLED: Final = {"{request_id}": "1-1", "{proposal_id}": "1", "{job_id}": "1", "{ref_key}": "rp-1",
                 "{kind}": "transfer", "{downstream}": "payment", "{name}": "not-found", "{group}": "0" * 32}  # fmt: skip
CASES: Final[dict[str, dict[str, Any]]] = {
    "no token": {"token": None, "content": b"{}", "type": "application/json"},
    "forged token": {"token": "cmp_forged", "content": b"{}", "type": "application/json"},
    "not JSON": {"content": b'{"reason": ', "type": "application/json"},
    "not sent as JSON": {"content": b"{}", "type": "text/plain"},
    "nested too deep": {"content": b"[" * 5000 + b"]" * 5000, "type": "application/json"},
    "too large": {"content": b'{"a": "' + b"x" * 2_000_000 + b'"}', "type": "application/json"},
}


async def test_every_error_is_a_problem_with_a_status_the_description_lists(api: Api) -> None:
    spec = (await api.client.get("/openapi.json")).json()
    walked = 0
    for path, item in spec["paths"].items():
        concrete = path
        for name, value in FILLED.items():
            concrete = concrete.replace(name, value)
        assert "{" not in concrete, f"{path}: a path parameter this walk cannot fill"
        for method, operation in item.items():
            declared = set(operation["responses"])
            cases = dict(CASES) if "requestBody" in operation else {k: CASES[k] for k in ("no token", "forged token")}
            if method == "get" and any(p["in"] == "query" for p in operation.get("parameters", ())):
                cases["unknown query parameter"] = {"query": {"no_such_parameter": "1"}}
            for case, sent in cases.items():
                token = sent.get("token", api.tokens[Role.ADMIN])
                headers = {"Idempotency-Key": "problems-1"} | ({} if token is None else {"Authorization": f"Bearer {token}"})
                if "type" in sent:
                    headers["Content-Type"] = sent["type"]
                answer = await api.client.request(method.upper(), concrete, content=sent.get("content"),
                                                  params=sent.get("query"), headers=headers)  # fmt: skip
                where = (method.upper(), path, case, answer.status_code)
                if path in ("/healthz", "/readyz", "/openapi.json") or path.startswith("/problems"):
                    continue  # no token needed: nothing to refuse
                assert answer.status_code >= 400, where
                assert str(answer.status_code) in declared, (*where, sorted(declared))
                assert answer.headers["content-type"] == "application/problem+json", where
                problem = answer.json()
                assert problem["status"] == answer.status_code and problem["type"].startswith("/problems/"), where
                assert TYPES[problem["type"].removeprefix("/problems/")].status == answer.status_code, where
                walked += 1
    assert walked > 100, walked


async def test_each_problem_type_is_described_at_its_uri(api: Api) -> None:
    for problem in TYPES.values():
        answer = await api.client.get(problem.uri)
        assert answer.status_code == 200 and answer.json()["status"] == problem.status, problem.uri
