"""Routes whose body is optional in /openapi.json (every field has a default) take a POST with no
body at all, as a client that follows the document sends it; a body that is there is still checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.openapi import build
from tests.gateway.conftest import Client, settled
from tests.gateway.helpers import tree_digest

MAIN = "/v1/sessions/agent%3Amain%3Amain"


@pytest.fixture
async def client(client: Client) -> Client:
    assert (await client.post(f"{MAIN}/messages", json={"content": "hello"})).status == 200
    await settled(client)
    return client


def optional_body_routes(app: Any) -> list[tuple[str, str]]:
    document = build(app.router.routes())
    return sorted(
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method, op in item.items()
        if "requestBody" in op and not op["requestBody"]["required"] and not op.get("x-undescribed")
    )


async def test_the_document_marks_these_bodies_optional(client: Any) -> None:
    assert optional_body_routes(client.app) == [
        ("POST", "/v1/admin/backup"),
        ("POST", "/v1/admin/cleanup"),
        ("POST", "/v1/admin/doctor"),
        ("POST", "/v1/memory/reindex"),
        ("POST", "/v1/sessions/{key}/fail"),
    ]


@pytest.mark.parametrize("headers", [{}, {"Content-Type": "application/json"}], ids=["no-type", "json-type"])
async def test_an_empty_body_takes_the_defaults(client: Any, headers: dict[str, str]) -> None:
    doctor = await client.post("/v1/admin/doctor", headers=headers)
    assert doctor.status == 200, await doctor.text()
    cleanup = await client.post("/v1/admin/cleanup", headers=headers)
    assert cleanup.status == 200, await cleanup.text()
    assert (await cleanup.json())["dry_run"] is False
    failed = await client.post(f"{MAIN}/fail", headers=headers)
    assert failed.status == 200, await failed.text()
    assert (await failed.json())["status"] == "failed"
    run = (await (await client.get("/v1/runs?status=failed")).json())["runs"][0]
    assert run["error_message"] == "failed by request"


async def test_reindex_takes_an_empty_body(client: Any) -> None:
    resp = await client.post("/v1/memory/reindex")
    assert resp.status == 200, await resp.text()
    assert "report" in await resp.json()


@pytest.mark.parametrize(
    ("data", "headers", "code"),
    [
        (b'{"dry_run": true}', {"Content-Type": "text/plain"}, "invalid_body"),
        (b"{oops", {"Content-Type": "application/json"}, "invalid_body"),
        (b'{"dry_run": true, "colour": 1}', {"Content-Type": "application/json"}, "invalid_field"),
        (b"[]", {"Content-Type": "application/json"}, "invalid_body"),
    ],
)
async def test_a_body_that_is_there_is_still_checked(
    client: Any, tmp_path: Path, data: bytes, headers: dict[str, str], code: str
) -> None:
    before = tree_digest(tmp_path)
    for path in ("/v1/admin/cleanup", f"{MAIN}/fail"):
        resp = await client.post(path, data=data, headers=headers)
        assert resp.status == 400 and (await resp.json())["error"]["code"] == code, await resp.text()
    assert tree_digest(tmp_path) == before
