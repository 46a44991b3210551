"""Resets, cleanup and cron sessions through the app, with an injected clock and the jobs called
directly (the real scheduler's timing is tested in tests/scheduler)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway.keys import SCHEDULING
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app

Client = TestClient[Any, Any]
MAIN = "/v1/sessions/agent%3Amain%3Amain"
NY = {"session": {"reset": {"timezone": "America/New_York"}}}


def ny(hour: int, minute: int = 0, day: int = 30) -> datetime:
    """A New York wall time on 2026-11-(day) (EST, UTC-5) as aware UTC."""
    return datetime(2026, 11, day, hour + 5, minute, tzinfo=UTC) if hour + 5 < 24 else datetime(
        2026, 11, day + 1, hour + 5 - 24, minute, tzinfo=UTC)  # fmt: skip


async def post(client: Client, text: str, key: str = MAIN) -> dict[str, Any]:
    resp = await client.post(f"{key}/messages", json={"content": text})
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = await resp.json()
    return body


async def test_restart_after_the_boundary_resets_exactly_once(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    clock.set(ny(3, 30))
    client = await aiohttp_client(make_app(tmp_path, clock, NY))
    first = await post(client, "late night question")
    await client.close()

    clock.set(ny(4, 10))
    client = await aiohttp_client(make_app(tmp_path, clock, NY))
    startup = client.server.app[SCHEDULING].startup
    assert startup is not None and await startup == 1
    entry = await (await client.get(MAIN)).json()
    assert entry["run_id"] is None and entry["status"] == "idle" and entry["last_run_id"] == first["run_id"]
    run = await (await client.get(f"/v1/runs/{first['run_id']}")).json()
    assert run["status"] == "completed"
    await client.close()

    clock.set(ny(4, 20))
    client = await aiohttp_client(make_app(tmp_path, clock, NY))
    second = await post(client, "good morning")
    assert second["run_id"] != first["run_id"]
    assert [e["run_id"] for e in second["events"] if e["type"] == "inheritance"] == [first["run_id"]]
    runs = await (await client.get("/v1/runs?key=agent%3Amain%3Amain")).json()
    assert len(runs["runs"]) == 2, "reset once, not again on the next start"


async def test_a_message_arriving_after_the_boundary_resets_first(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    overrides = {"session": {"reset": {"timezone": "America/New_York", "defer_if_active_minutes": 0}}}
    clock.set(ny(3, 0))
    client = await aiohttp_client(make_app(tmp_path, clock, overrides))
    first = await post(client, "before")
    clock.set(ny(9, 0))
    second = await post(client, "after")
    assert second["run_id"] != first["run_id"]
    assert [e["type"] for e in second["events"]][:1] == ["reset"]


async def test_user_activity_after_the_boundary_defers_up_to_the_cap(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    app = make_app(tmp_path, clock, NY)
    clock.set(ny(3, 59))
    client = await aiohttp_client(app)
    first = await post(client, "still chatting at 03:59")
    clock.set(ny(4, 1))
    during = await post(client, "04:01, mid-conversation")
    assert during["run_id"] == first["run_id"], "deferred by activity after the boundary"
    detail = await (await client.get(MAIN)).json()
    assert detail["next_reset"] is not None
    scheduling = app[SCHEDULING]
    clock.set(ny(4, 20))
    assert await scheduling.sweep() == 0
    clock.set(ny(4, 32))
    assert await scheduling.sweep() == 1, "due 30 minutes after the last activity"
    assert (await (await client.get(MAIN)).json())["run_id"] is None


async def test_idle_reset_with_fractional_minutes(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    overrides = {"session": {"reset": {"mode": "idle", "idle_minutes": 0.5}}}
    client = await aiohttp_client(make_app(tmp_path, clock, overrides))
    first = await post(client, "hello")
    clock.advance(seconds=20)
    assert (await post(client, "still here"))["run_id"] == first["run_id"]
    clock.advance(seconds=31)
    later = await post(client, "back after a pause")
    assert later["run_id"] != first["run_id"]
    assert any(e["type"] == "reset" and e["reason"] == "idle" for e in later["events"])


async def test_cron_jobs_post_to_their_session(aiohttp_client: Any, tmp_path: Path, clock: FakeClock) -> None:
    received: list[dict[str, Any]] = []

    async def sink(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.json_response({"ok": True})

    receiver = web.Application()
    receiver.router.add_post("/deliver", sink)
    receiver_client = await aiohttp_client(receiver)
    url = str(receiver_client.make_url("/deliver"))
    jobs = [
        {"id": "digest", "schedule": "0 9 * * 1-5", "message": "daily digest please", "deliver_to": url},
        {"id": "ping", "schedule": "*/5 * * * *", "message": "ping", "isolated": True},
    ]
    client = await aiohttp_client(make_app(tmp_path, clock, {"cron": {"jobs": jobs}}))
    listing = await (await client.get("/v1/scheduler/jobs")).json()
    ids = {job["id"] for job in listing["jobs"]}
    assert {"daily_reset", "sweep", "cleanup", "cron:digest", "cron:ping"} <= ids
    assert all(job["next_run_at"] for job in listing["jobs"] if job["id"] != "sweep")
    ran = await client.post("/v1/scheduler/jobs/digest/run")
    assert ran.status == 200, await ran.text()
    digest = await (await client.get("/v1/sessions/cron%3Adigest")).json()
    assert digest["chat_type"] == "cron" and digest["run_id"] is not None
    assert received and received[0]["session_key"] == "cron:digest"
    for _ in range(2):
        assert (await client.post("/v1/scheduler/jobs/cron%3Aping/run")).status == 200
    runs = await (await client.get("/v1/runs?key=cron%3Aping")).json()
    assert [r["status"] for r in runs["runs"]] == ["completed", "completed"], "isolated: a run per firing"
    missing = await client.post("/v1/scheduler/jobs/nope/run")
    assert missing.status == 404


async def test_cleanup_archives_old_runs_and_keeps_them_readable(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock, {"cleanup": {"retention_days": 30}}))
    old = await post(client, "an old conversation about /srv/data")
    await client.post(f"{MAIN}/complete")
    pinned_key = "/v1/sessions/agent%3Amain%3Adm%3Avip"
    pinned = await post(client, "keep me", key=pinned_key)
    await client.patch(pinned_key, json={"pinned": True})
    await client.post(f"{pinned_key}/complete")
    clock.advance(days=31)
    dry = await (await client.post("/v1/admin/cleanup", json={"dry_run": True})).json()
    assert [(a["action"], a["run_id"]) for a in dry["actions"]] == [("archive", old["run_id"])]
    assert (tmp_path / "contexts/completed" / old["run_id"]).is_dir(), "a dry run changes nothing"
    done = await (await client.post("/v1/admin/cleanup", json={})).json()
    assert [a["done"] for a in done["actions"]] == [True]
    assert not (tmp_path / "contexts/completed" / old["run_id"]).exists()
    assert (tmp_path / "contexts/archive" / f"{old['run_id']}.tar.gz").exists()
    assert (tmp_path / "contexts/completed" / pinned["run_id"]).is_dir(), "pinned keys are never touched"
    run = await (await client.get(f"/v1/runs/{old['run_id']}")).json()
    assert run["archived"] is True
    messages = await (await client.get(f"/v1/runs/{old['run_id']}/messages")).json()
    assert messages["messages"][0]["content"] == "an old conversation about /srv/data"
    final = await (await client.get(f"/v1/runs/{old['run_id']}/final-summary")).json()
    assert "/srv/data" in final["final_summary"]
    again = await (await client.post("/v1/admin/cleanup", json={"dry_run": False})).json()
    assert again["actions"] == []
    bad = await client.post("/v1/admin/cleanup", json={"dry_run": "maybe"})
    assert bad.status == 400


async def test_stale_active_runs_are_completed_then_archived(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    overrides = {"cleanup": {"retention_days": 1}, "session": {"reset": {"mode": "none"}}}
    client = await aiohttp_client(make_app(tmp_path, clock, overrides))
    body = await post(client, "forgotten")
    clock.advance(days=2)
    report = await (await client.post("/v1/admin/cleanup", json={})).json()
    assert [a["action"] for a in report["actions"]] == ["complete", "archive"]
    assert json.loads(json.dumps(report))["actions"][1]["run_id"] == body["run_id"]


async def test_cleanup_forgets_redelivery_records_past_their_window(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    app = make_app(tmp_path, clock)
    client = await aiohttp_client(app)
    await client.post(f"{MAIN}/messages", json={"content": "once", "client_message_id": "m-old"})
    clock.advance(hours=25)
    await client.post(f"{MAIN}/messages", json={"content": "later", "client_message_id": "m-new"})
    await client.post("/v1/admin/cleanup", json={})
    store = app[SCHEDULING].store
    ids = await store.ledger.execute(lambda c: [r[0] for r in c.execute("SELECT client_message_id FROM idempotency")])
    assert ids == ["m-new"]
