"""GET /openapi.json: every registered route, its body and its error codes, and nothing invented;
each route described by the ``@operation`` beside its handler, each code by its error class."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from openapi_spec_validator import validate

import gateway.api
from config.errors import NeotaskError, error_classes
from gateway import openapi
from gateway.api.runs import PlanBody, ToolBody
from gateway.api.sessions import CommandBody, FailBody, IngressBody, MessageBody, PatchBody
from gateway.contract import operation_of

Client = TestClient[Any, Any]
# raised at start-up or by the CLI, never answered
NOT_HTTP = {"invalid_config", "gateway_running", "damaged_state", "home_not_empty", "database_refused"}
# Answerable, but no route lists them: `unavailable` comes from the connection cap (before any route), `conflict`
# is a family nothing raises as such, and the others are guards a route checks first (memory routes refuse an
# unknown agent as invalid_field; a turn never starts a run over an active one).
NO_ROUTE = {"conflict", "unavailable", "unknown_agent", "run_active"}


async def later_route(request: web.Request) -> web.Response:
    return web.json_response({})


def with_later_routes(app: web.Application) -> web.Application:
    """A route nobody described yet."""
    app.router.add_route("PUT", "/v1/experimental/{thing}", later_route)
    return app


@pytest.fixture
def gateway_overrides() -> dict[str, Any]:
    return {"gateway": {"tokens": ["s3cret"]}}


@pytest.fixture
def gateway_app(gateway_app: web.Application) -> web.Application:
    return with_later_routes(gateway_app)


async def fetch(client: Client) -> dict[str, Any]:
    resp = await client.get("/openapi.json")
    assert resp.status == 200, await resp.text()
    document: dict[str, Any] = await resp.json()
    return document


async def test_every_registered_route_is_documented(client: Client) -> None:
    document = await fetch(client)
    registered = openapi.route_list(client.app.router.routes())
    assert ("POST", "/v1/sessions/{key}/messages") in {(m, p) for m, p, _ in registered}
    for method, path, _ in registered:
        assert method.lower() in document["paths"].get(path, {}), f"{method} {path} missing from /openapi.json"
    documented = {(m.upper(), p) for p, item in document["paths"].items() for m in item}
    assert documented == {(m, p) for m, p, _ in registered}


def route_tables() -> list[web.RouteTableDef]:
    """The route table of every route module (gateway/api/*.py and the OpenAI-compatible routes)."""
    names = [f"gateway.api.{m.name}" for m in pkgutil.iter_modules(gateway.api.__path__)]
    modules = [importlib.import_module(n) for n in [*names, "gateway.openai_compat.routes"]]
    return [m.routes for m in modules if isinstance(getattr(m, "routes", None), web.RouteTableDef)]


async def test_every_route_is_described_and_every_described_route_is_registered(client: Client) -> None:
    routes = [r for r in openapi.route_list(client.app.router.routes()) if r[0] != "HEAD"]
    registered = {r for r in routes if r[1] != "/v1/experimental/{thing}"}
    undescribed = sorted(f"{m} {p}" for m, p, h in registered if operation_of(h) is None)
    assert undescribed == [], f"put an @operation on their handlers: {undescribed}"
    described = [
        (route.method, route.path, route.handler)
        for table in route_tables()
        for route in table
        if isinstance(route, web.RouteDef) and operation_of(route.handler) is not None
    ]
    assert len(described) >= 40
    handlers = {h for _, _, h in registered}
    missing = sorted(f"{m} {p}" for m, p, h in described if h not in handlers)
    assert missing == [], f"described but not registered by create_app: {missing}"
    document = await fetch(client)
    flagged = [f"{m} {p}" for p, item in document["paths"].items() for m, op in item.items() if op.get("x-undescribed")]
    assert flagged == ["put /v1/experimental/{thing}"]


async def test_an_undescribed_route_is_still_listed(client: Client) -> None:
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


def test_one_class_per_code_each_with_its_status_and_meaning() -> None:
    import gateway.app  # noqa: F401  (every error class of the code base is loaded)
    import home.lock  # noqa: F401

    every = error_classes(http_only=False)
    assert set(every) - set(error_classes()) == NOT_HTTP
    for code, cls in every.items():
        assert cls.code == code and issubclass(cls, NeotaskError), cls
        assert 400 <= cls.status < 600 and cls.doc, cls
    with pytest.raises(TypeError, match="defined twice"):
        type("Again", (NeotaskError,), {"code": "session_not_found"})
    with pytest.raises(TypeError, match="raise the class of that code"):
        NeotaskError("a code is a class, not a string", code="session_not_found")


async def test_the_document_names_every_http_code_and_only_those(client: Client) -> None:
    document = await fetch(client)
    used = openapi.error_codes(document)
    assert used == set(error_classes()) - NO_ROUTE, f"no route documents {sorted(set(error_classes()) - used)}"
    assert document["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"] == sorted(
        error_classes()
    )
    for item in document["paths"].values():
        for operation in item.values():
            for status, response in operation["responses"].items():
                for code in response.get("x-error-codes", ()):
                    assert error_classes()[code].status == int(status), (code, status)


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


def test_docs_errors_md_is_the_table_of_the_classes() -> None:
    import gateway.app  # noqa: F401

    text = (Path(__file__).resolve().parents[2] / "docs/errors.md").read_text(encoding="utf-8")
    assert text.endswith("\n\n" + openapi.errors_markdown()), "regenerate it: python -m gateway.errors_table"


async def test_each_published_limit_and_enum_is_the_one_the_handler_enforces(client: Client) -> None:
    """For every described GET route without path parameters: a value just past an integer
    parameter's published maximum, and one outside a parameter's published enum, is refused with
    400 invalid_field naming that parameter; the published maximum itself is taken."""
    headers = {"Authorization": "Bearer s3cret"}
    checked = []
    for method, path, handler in openapi.route_list(client.app.router.routes()):
        described = operation_of(handler)
        if method != "GET" or "{" in path or described is None:
            continue
        required = {p.name: "x" for p in described.params if p.required}
        for param in described.params:
            if param.where != "query" or param.required:
                continue
            schema = param.schema
            if schema.get("type") == "integer" and "maximum" in schema:
                top = {**required, param.name: str(schema["maximum"])}
                accepted = await client.get(path, params=top, headers=headers)
                assert accepted.status != 400, (path, param.name, await accepted.text())
                bad = str(schema["maximum"] + 1)
            elif "enum" in schema:
                bad = "not-" + "-".join(schema["enum"])
            else:
                continue
            resp = await client.get(path, params={**required, param.name: bad}, headers=headers)
            error = (await resp.json())["error"]
            assert (resp.status, error["code"], error.get("field")) == (400, "invalid_field", param.name), path
            checked.append(f"{path}?{param.name}")
    assert {"/v1/sessions?limit", "/v1/sessions?status", "/v1/sessions?type", "/v1/runs?limit"} <= set(checked)
