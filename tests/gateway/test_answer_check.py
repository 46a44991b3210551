"""The check every gateway test's client runs (tests/gateway/answer_check.py) finds an answer the
document does not describe: a wrong type, a field it does not name, a status it does not list; and
the typed answers' schemas follow their types."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from config.errors import RunNotFound
from gateway.api.runs import RUN
from gateway.contract import Answer, operation
from gateway.views import SESSION
from sessions.files.registry import SessionEntry
from sessions.records import RunRow
from tests.gateway import answer_check

THING = Answer("Thing", {"type": "object", "properties": {"name": {"type": "string"}, "size": {"type": "integer"}}})
routes = web.RouteTableDef()


@routes.get("/things/{answer}")
@operation("A thing", "test", answer=THING, errors=(RunNotFound,))
async def thing(request: web.Request) -> web.Response:
    bodies: dict[str, Any] = {
        "good": {"name": "a", "size": 1},
        "wrong_type": {"name": "a", "size": "big"},
        "unnamed_field": {"name": "a", "colour": "red"},
    }
    which = request.match_info["answer"]
    if which == "teapot":
        return web.json_response({"name": "a"}, status=418)
    return web.json_response(bodies[which])


async def answers(aiohttp_client: Any, *paths: str) -> list[str]:
    app = web.Application()
    app.add_routes(routes)
    answer_check.install(app)
    client: TestClient[Any, Any] = await aiohttp_client(app)
    for path in paths:
        resp = await client.get(path)
        await resp.read()
    found: list[str] = app[answer_check.MISMATCHES]
    return found


async def test_a_described_answer_passes(aiohttp_client: Any) -> None:
    assert await answers(aiohttp_client, "/things/good") == []


async def test_a_wrong_type_an_unnamed_field_and_an_unlisted_status_are_mismatches(aiohttp_client: Any) -> None:
    found = await answers(aiohttp_client, "/things/wrong_type", "/things/unnamed_field", "/things/teapot")
    assert len(found) == 3, found
    assert "at size: 'big' is not of type 'integer'" in found[0]
    assert "'colour' was unexpected" in found[1]
    assert "answered 418, which the document does not list" in found[2]


def test_the_session_and_run_answers_name_every_field_of_their_types() -> None:
    """Derived, not written: a field added to SessionEntry or RunRow is a documented field."""
    session = SESSION.schema["properties"]
    assert {f.name for f in fields(SessionEntry)} <= set(session)
    assert session["input_tokens"] == {"type": "integer"}
    assert {"key", "chat_type", "created_at"} <= set(SESSION.schema["required"])
    run = RUN.schema["properties"]
    assert set(RunRow.__annotations__) <= set(run)
    assert run["status"]["enum"] == ["running", "paused", "completed", "failed"]
    assert run["pinned"] == {"type": "boolean"} and "archived" in run
    assert set(RUN.schema["required"]) == {"uuid", "status", "created_at"}
