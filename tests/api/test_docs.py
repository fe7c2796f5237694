"""The description and its page: /openapi.json, and /docs served entirely from this process."""

from __future__ import annotations

import re

from api_support import Api


async def test_the_docs_page_needs_no_internet(api: Api) -> None:
    page = await api.client.get("/docs")
    assert page.status_code == 200
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources and all(source.startswith("/static/") for source in sources), sources
    assert "cdn" not in page.text.lower()
    for source in sources:
        asset = await api.client.get(source)
        assert asset.status_code == 200 and len(asset.content) > 500, source


async def test_the_description_names_its_parts(api: Api) -> None:
    document = (await api.client.get("/openapi.json")).json()
    submit = document["paths"]["/v1/requests"]["post"]
    assert submit["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Submission"}
    assert [p["name"] for p in submit["parameters"]] == ["Idempotency-Key"] and submit["parameters"][0]["required"]
    assert set(submit["responses"]) >= {"200", "201", "400", "401", "403", "413", "415", "422", "429", "503"}
    assert "/problems/idempotency-key-reused" in submit["responses"]["422"]["description"]
    schemas = document["components"]["schemas"]
    assert {"Submission", "TransferPayload", "Problem", "RetryPolicy", "BatchSubmission"} <= set(schemas)
    assert "CNY" in schemas["TransferPayload"]["properties"]["currency"]["enum"]
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
