"""Property-based fuzzing of the HTTP API from its own /openapi.json (SPEC section 8): whatever an
operation is sent (path values, query values, JSON bodies shaped by its schema, raw bytes with any
content type) it never answers 5xx, every error has the JSON error shape with a documented code,
and a rejected request changes nothing on disk. Bounded: a fixed number of examples per operation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from config.errors import error_classes
from gateway import keys as K
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app, tree_digest

# Each operation gets its own examples, in two rounds (the second acts on what the first left). One
# pool of 3,000 examples for all operations gave one operation a single example and another 205, and
# reached fewer (operation, status, error code) pairs than these 2 x 20 per operation (130 against 134).
EXAMPLES_PER_OPERATION = 20
ROUNDS = 2
SKIP = {
    ("get", "/v1/events"),  # a stream that does not end
    ("post", "/v1/memory/reindex"),  # embeds the workspace: slow, and covered by the memory tests
    ("post", "/v1/admin/cleanup"),  # acts on the clock, not on the request
    ("post", "/v1/admin/doctor"),
}
KEYS = ["agent:main:main", "agent:main:dm:p1", "cron:daily", "hook:github:o/r:issue:1", "agent:ghost:main"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=40)
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
texts = st.text(max_size=60) | st.sampled_from(["", "/", "/status", "/model x", "..", "%", "%3A", "\x00", "a" * 300])
body_texts = texts | st.sampled_from(["\ud800", "x\udfff", "\ud83d\ude00"])  # escaped by json.dumps


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return sorted(
        (method, path, op)
        for path, item in document["paths"].items()
        for method, op in item.items()
        if method != "head" and (method, path) not in SKIP and not path.startswith("/ui")
    )


def body_schema(document: dict[str, Any], op: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    ref = schema.get("$ref", "")
    if ref:
        schema = document["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return schema


def plausible(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Mostly values of the property's own type (so a request gets past its other fields), sometimes junk."""
    if "enum" in schema:
        typed: st.SearchStrategy[Any] = st.sampled_from(schema["enum"])
    else:
        kinds = {s.get("type") for s in schema.get("anyOf", [schema])}
        typed = st.nothing()
        if "string" in kinds:
            typed |= body_texts
        if "boolean" in kinds:
            typed |= st.booleans()
        if "null" in kinds:
            typed |= st.none()
        if typed.is_empty:
            typed = json_values
    return st.one_of(typed, typed, typed, typed, typed, json_values)


def query_value(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    junk = st.text(max_size=12) | st.integers(-5, 2000).map(str)
    if "enum" in schema:
        return st.one_of(st.sampled_from(schema["enum"]), st.sampled_from(schema["enum"]), junk)
    if schema.get("type") == "integer":
        typed = st.integers(schema.get("minimum", -5), min(schema.get("maximum", 2000), 2000)).map(str)
        return st.one_of(typed, typed, junk)
    return junk


class Api:
    """The document, a run id and the operation fuzzed, with a short repr for Hypothesis's reports."""

    def __init__(self, document: dict[str, Any], run_id: str, operation: tuple[str, str, dict[str, Any]]) -> None:
        self.document = document
        self.run_id = run_id
        self.operation = operation

    def __repr__(self) -> str:
        return f"Api(/openapi.json, {self.operation[0].upper()} {self.operation[1]})"


@st.composite
def requests(draw: st.DrawFn, api: Api) -> tuple[str, str, dict[str, Any]]:
    document, run_id = api.document, api.run_id
    method, template, op = api.operation
    path = template
    for param in op.get("parameters", []):
        if param["in"] == "path":
            if param["name"] == "key":
                value = draw(st.one_of(st.sampled_from(KEYS), st.sampled_from(KEYS), texts))
            elif param["name"] == "uuid":
                value = draw(st.just(run_id) | texts)
            else:
                value = draw(texts)
            path = path.replace("{" + param["name"] + "}", quote(value, safe="") or "x")
    query = {
        p["name"]: draw(query_value(p["schema"]))
        for p in op.get("parameters", [])
        if p["in"] == "query" and (p["required"] or draw(st.booleans()))
    }
    kwargs: dict[str, Any] = {"params": query}
    if "requestBody" in op:
        schema = body_schema(document, op)
        properties, required = schema.get("properties", {}), set(schema.get("required", ()))
        shaped = st.fixed_dictionaries(
            {name: plausible(p) for name, p in properties.items() if name in required},
            optional={name: plausible(p) for name, p in properties.items() if name not in required},
        )
        kind = draw(st.sampled_from(["shaped", "shaped", "shaped", "json", "raw", "none"]))
        if kind == "shaped":
            body = draw(shaped)
            body.pop("stream", None)  # a streamed answer is a 200 whose errors arrive as events
            kwargs["data"] = json.dumps(body).encode()
            kwargs["headers"] = {"Content-Type": "application/json"}
        elif kind == "json":
            kwargs["data"] = json.dumps(draw(json_values)).encode()
            kwargs["headers"] = {"Content-Type": "application/json"}
        elif kind == "raw":
            kwargs["data"] = draw(st.binary(max_size=60))
            kwargs["headers"] = {"Content-Type": draw(st.sampled_from(["application/json", "text/plain", ""]))}
    return method, path, kwargs


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_fuzzed_requests_never_fail_the_server_and_rejections_write_nothing(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    app = make_app(tmp_path, FakeClock(), {"hooks": {"plain": {"message_template": "${text}"}}})
    client: TestClient[Any, Any] = TestClient(TestServer(app), loop=loop)
    loop.run_until_complete(client.start_server())
    try:
        main = "/v1/sessions/agent%3Amain%3Amain/messages"
        seeded = loop.run_until_complete(client.post(main, json={"content": "x"}))
        run_id = loop.run_until_complete(seeded.json())["run_id"]
        document = loop.run_until_complete((loop.run_until_complete(client.get("/openapi.json"))).json())
        store = app[K.STORE]
        codes = error_classes()

        async def settled() -> None:
            """What earlier accepted requests left pending is on disk first: sessions.json, and the
            writer's queue (the ``.opening`` marker of the seeded run goes there once its message is
            durable, after the answer: a digest taken before that saw it vanish during a request)."""
            await store.registry.flush()
            await store.writer.call(lambda: None)

        async def send(method: str, path: str, kwargs: dict[str, Any]) -> None:
            await settled()
            before = tree_digest(tmp_path)
            resp = await client.request(method.upper(), path, **kwargs)
            text = await resp.text()
            where = f"{method.upper()} {path} {kwargs} -> {resp.status} {text[:300]}"
            assert resp.status < 500, where
            if resp.status >= 400:
                error = json.loads(text)["error"]
                assert error["code"] in codes and error["message"] and error["request_id"], where
                assert codes[error["code"]].status == resp.status, where
                await settled()
                assert tree_digest(tmp_path) == before, where

        # what creates first, what deletes last: each round starts with sessions and runs to act on
        fuzzed = sorted(operations(document), key=lambda o: ["post", "put", "patch", "get", "delete"].index(o[0]))
        assert len(fuzzed) > 40, fuzzed  # the document was read whole
        for n, operation in enumerate(fuzzed * ROUNDS):

            @seed(n)  # reproducible, and another draw for each operation and round
            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))  # fmt: skip
            @given(request=requests(Api(document, run_id, operation)))
            def check(request: tuple[str, str, dict[str, Any]]) -> None:
                loop.run_until_complete(send(*request))

            check()
    finally:
        loop.run_until_complete(client.close())
        loop.close()
