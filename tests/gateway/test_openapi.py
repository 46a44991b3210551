"""GET /openapi.json: every registered route, its body and its error codes, and nothing invented."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from openapi_spec_validator import validate

from gateway import openapi
from gateway.api.runs import PlanBody, ToolBody
from gateway.api.sessions import CommandBody, FailBody, IngressBody, MessageBody, PatchBody
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app

Client = TestClient[Any, Any]
ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "sessions", "config", "memory", "scheduler")
NOT_HTTP = {"invalid_config", "gateway_running", "damaged_state"}  # raised at start-up or by the CLI, never answered


async def later_route(request: web.Request) -> web.Response:
    return web.json_response({})


def with_later_routes(app: web.Application) -> web.Application:
    """Routes of later issues (unless already there): described in the table, with a regex path,
    and one nobody described."""
    registered = {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource is not None}
    for method, path, pattern in [
        ("POST", "/hooks/{name}", "/hooks/{name}"),
        ("GET", "/v1/memory/files/{path}", "/v1/memory/files/{path:.+}"),
        ("PUT", "/v1/experimental/{thing}", "/v1/experimental/{thing}"),
    ]:
        if (method, path) not in registered:
            app.router.add_route(method, pattern, later_route)
    return app


@pytest.fixture
async def client(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> Client:
    app = make_app(tmp_path, clock, {"gateway": {"tokens": ["s3cret"]}})
    return await aiohttp_client(with_later_routes(app))


async def fetch(client: Client) -> dict[str, Any]:
    resp = await client.get("/openapi.json")
    assert resp.status == 200, await resp.text()
    document: dict[str, Any] = await resp.json()
    return document


async def test_every_registered_route_is_documented(client: Client) -> None:
    document = await fetch(client)
    registered = openapi.route_list(client.app.router.routes())
    assert ("POST", "/v1/sessions/{key}/messages", "post_message") in registered
    for method, path, _ in registered:
        assert method.lower() in document["paths"].get(path, {}), f"{method} {path} missing from /openapi.json"
    documented = {(m.upper(), p) for p, item in document["paths"].items() for m in item}
    assert documented == {(m, p) for m, p, _ in registered}


async def test_later_routes_appear_and_an_undescribed_one_is_still_listed(client: Client) -> None:
    paths = (await fetch(client))["paths"]
    assert paths["/hooks/{name}"]["post"]["summary"] == "Webhook"
    assert paths["/v1/memory/files/{path}"]["get"]["summary"] == "A memory file's text"
    generic = paths["/v1/experimental/{thing}"]["put"]
    assert generic["x-undescribed"] is True and generic["summary"] == "PUT /v1/experimental/{thing}"
    assert [p["name"] for p in generic["parameters"]] == ["thing"]
    assert "x-undescribed" not in paths["/v1/sessions/{key}"]["get"]


async def test_the_document_is_valid_openapi_3_1(client: Client) -> None:
    document = await fetch(client)
    assert document["openapi"] == "3.1.0"
    await asyncio.to_thread(validate, document)  # a second or two of pure Python: off the loop


async def test_security_follows_the_auth_middleware(client: Client) -> None:
    paths = (await fetch(client))["paths"]
    assert paths["/v1/sessions"]["get"]["security"] == [{"bearerAuth": []}]
    assert paths["/metrics"]["get"]["security"] == [{"bearerAuth": []}]
    assert {"accessToken": []} in paths["/v1/events"]["get"]["security"]
    for path, method in [("/hooks/{name}", "post"), ("/healthz", "get"), ("/openapi.json", "get")]:
        assert paths[path][method]["security"] == []
    assert "401" not in paths["/healthz"]["get"]["responses"]
    assert paths["/hooks/{name}"]["post"]["responses"]["401"]["x-error-codes"] == ["invalid_signature"]
    assert "unauthorized" in paths["/v1/runs"]["get"]["responses"]["401"]["x-error-codes"]


async def test_request_bodies_are_the_route_models(client: Client) -> None:
    document = await fetch(client)
    schemas = document["components"]["schemas"]
    for model in (IngressBody, MessageBody, CommandBody, PatchBody, FailBody, ToolBody, PlanBody):
        assert schemas[model.__name__] == model.model_json_schema(ref_template="#/components/schemas/{model}")
    body = document["paths"]["/v1/sessions/{key}/messages"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/MessageBody"}


async def test_message_answers_and_streams_are_described(client: Client) -> None:
    document = await fetch(client)
    ok = document["paths"]["/v1/messages"]["post"]["responses"]["200"]["content"]
    assert set(ok) == {"application/json", "text/event-stream"}
    answer = document["components"]["schemas"]["MessageAnswer"]
    assert answer["required"] == ["session_key", "run_id", "message_seq", "reply", "events", "usage"]
    failed = document["paths"]["/v1/sessions/{key}/messages"]["post"]["responses"]["502"]
    assert failed["x-error-codes"] == ["provider_error"]
    error = document["components"]["schemas"]["Error"]["properties"]["error"]
    assert {"message_seq", "stored"} <= set(error["properties"])


def source_texts() -> dict[Path, str]:
    return {
        path: path.read_text(encoding="utf-8")
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "gateway/openapi.py"
    }


def test_every_catalogued_code_is_produced_by_the_code_base() -> None:
    texts = "\n".join(source_texts().values())
    never = [code for code in openapi.ERROR_CODES if f'"{code}"' not in texts]
    assert never == [], f"documented but produced nowhere: {never}"


def test_every_code_the_code_base_raises_is_catalogued() -> None:
    raised: set[str] = set()
    for text in source_texts().values():
        raised.update(re.findall(r'\bcode=\s*"([a-z_]+)"', text))
        raised.update(re.findall(r'default_code(?:: ClassVar\[str\])? = "([a-z_]+)"', text))
    missing = sorted(raised - set(openapi.ERROR_CODES) - NOT_HTTP)
    assert missing == [], f"add these to ERROR_CODES in gateway/openapi.py: {missing}"


async def test_the_document_only_uses_catalogued_codes(client: Client) -> None:
    used = openapi.error_codes(await fetch(client))
    assert used <= set(openapi.ERROR_CODES)
    assert {"invalid_body", "invalid_field", "invalid_key", "session_not_found", "run_not_found"} <= used


@pytest.mark.parametrize(
    ("method", "path", "doc_path", "kwargs"),
    [
        ("post", "/v1/sessions/agent%3Amain%3Amain/messages", "/v1/sessions/{key}/messages", {"data": b"{x"}),
        ("post", "/v1/sessions/agent%3Amain%3Amain/messages", "/v1/sessions/{key}/messages", {"json": {"x": 1}}),
        ("post", "/v1/sessions/agent%3Anobody%3Amain/messages", "/v1/sessions/{key}/messages", {"json": {}}),
        ("get", "/v1/sessions/agent%3Amain%3Amain", "/v1/sessions/{key}", {}),
        ("post", "/v1/sessions/agent%3Amain%3Amain/pause", "/v1/sessions/{key}/pause", {}),
        ("get", "/v1/runs/0a0a0a0a-0000-4000-8000-000000000000", "/v1/runs/{uuid}", {}),
        ("get", "/v1/runs", "/v1/runs", {"params": {"limit": "zero"}}),
        ("delete", "/v1/runs", "/v1/runs", {}),
    ],
)
async def test_real_errors_are_among_the_documented_codes(
    client: Client, method: str, path: str, doc_path: str, kwargs: dict[str, Any]
) -> None:
    document = await fetch(client)
    headers = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
    resp = await client.request(method, path, headers=headers, **kwargs)
    body = await resp.json()
    assert resp.status >= 400, body
    operation = document["paths"][doc_path].get(method) or document["paths"][doc_path]["get"]
    documented = operation["responses"][str(resp.status)]["x-error-codes"]
    assert body["error"]["code"] in documented


def test_an_app_without_routes_still_gets_a_document() -> None:
    document = openapi.build([])
    assert document["paths"] == {}
    assert "Error" in document["components"]["schemas"]
