"""Pairing: a code was sent again for every message of an unknown sender, the sender heard nothing
when approved, codes never expired, and there was no way to list the codes or to revoke an
approval. Now a code is sent once per sender per code lifetime (``pairing_code_lifetime_s``), an
expired code is refused (``pairing_code_expired``) and the sender's next message gets a new one;
an approval made through the API (``neotask channels approve`` when the daemon runs) reaches the
running connector, which tells the sender; one made offline is told at the next start;
``GET /v1/channels/pairings`` and ``POST /v1/channels/revoke`` (``neotask channels pairings`` /
``revoke``) list and revoke. In-process: the gateway app with a FakeClock, slack_sdk against the
local Slack server, ``channels.db`` on disk."""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from channels.access import DirectAccess
from channels.protocol import Inbound, Target
from channels.store import ChannelStore
from config.channels import SlackAccount
from config.clock import iso, system_clock
from tests.channels.harness import wait_until
from tests.conftest import FakeClock
from tests.gateway import answer_check
from tests.gateway.helpers import Cli, make_app, tree_digest
from tests.support.openai_server import OpenAIServer
from tests.support.slack_server import SlackServer

BOT, APP = "xoxb-pairing", "xapp-pairing"
OWNER, ANN = "U0OWNER", "U0ANN"


OLD_TABLE = (
    "CREATE TABLE pairing (code TEXT PRIMARY KEY, channel TEXT NOT NULL, account TEXT NOT NULL,"
    " sender_id TEXT NOT NULL, sender_name TEXT, created_at TEXT NOT NULL, approved_at TEXT)"
)  # the table as homes made before codes expired have it


def code_in(text: str) -> str:
    return text.split("Pairing code: ")[1].split()[0]


async def test_one_code_per_lifetime_approval_told_expiry_refused_list_and_revoke(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    async with OpenAIServer() as model, SlackServer() as slack:
        app = slack.add_app(BOT, APP)
        account = {"bot_token_env": "PAIR_BOT", "app_token_env": "PAIR_APP", "api_base": slack.url,
                   "dm_policy": "pairing", "allow_from": [OWNER], "pairing_code_lifetime_s": 600}  # fmt: skip
        overrides = {"channels": {"slack": {"accounts": {"work": account}}}}
        gateway = make_app(tmp_path, clock, overrides, base_url=model.base_url, env={"PAIR_BOT": BOT, "PAIR_APP": APP})
        client = await aiohttp_client(answer_check.install(gateway))  # every answer as /openapi.json says

        async def write(text: str) -> None:
            envelope = f"env-{int(slack.message(app, channel='D1', user=ANN, text=text)[2:])}"
            await wait_until(lambda: envelope in app.acks)

        def said() -> list[str]:
            return [str(c.params["text"]) for c in slack.posted("D1")]

        await write("hello?")
        [notice] = said()
        code = code_in(notice)
        assert "(good for 10 minutes)" in notice and f"neotask channels approve {code}" in notice
        await write("hello??")
        await write("anyone?")
        assert said() == [notice]  # once per code, not per message

        listed = await (await client.get("/v1/channels/pairings")).json()
        [pending] = listed["pairings"]
        assert (pending["code"], pending["state"], pending["sender_id"]) == (code, "pending", ANN)
        assert pending["expires_at"] == iso(clock() + timedelta(minutes=10))
        assert (await (await client.get("/v1/channels/pairings?state=approved")).json())["pairings"] == []

        # bad input: a JSON error with its code and what to do; nothing changes on disk
        before = tree_digest(tmp_path)
        for path, body, status, error in (
            ("/v1/channels/approve", {"code": "0O1I"}, 400, "invalid_field"),
            ("/v1/channels/approve", {"code": "WXYZ2345"}, 404, "pairing_code_not_found"),
            ("/v1/channels/revoke", {"code": "WXYZ2345"}, 404, "pairing_code_not_found"),
            ("/v1/channels/revoke", {"code": ""}, 400, "invalid_field"),
            ("/v1/channels/revoke", {"code": code, "sender": ANN}, 400, "invalid_field"),
        ):
            resp = await client.post(path, json=body)
            error_body = (await resp.json())["error"]
            assert (resp.status, error_body["code"]) == (status, error), (path, body, error_body)
        bad_state = await client.get("/v1/channels/pairings?state=bogus")
        assert bad_state.status == 400 and "'state' must be pending, approved or expired" in (
            await bad_state.json())["error"]["message"]  # fmt: skip
        assert tree_digest(tmp_path) == before

        approved = await (await client.post("/v1/channels/approve", json={"code": code.lower()})).json()
        assert (approved["state"], approved["notified"]) == ("approved", True)
        assert said()[1] == "You are approved: this app takes your messages now."  # in the sender's DM
        await write("now?")
        await wait_until(lambda: said()[-1] == "echo: now?")

        revoked = await (await client.post("/v1/channels/revoke", json={"code": code})).json()
        assert (revoked["revoked"], revoked["sender_id"]) == (True, ANN)
        asked = len(model.chat_requests)
        await write("still in?")
        second = code_in(said()[-1])  # a stranger again: a new code, nothing stored
        assert second != code and len(model.chat_requests) == asked

        clock.advance(minutes=10)
        before = tree_digest(tmp_path)
        late = await client.post("/v1/channels/approve", json={"code": second})
        error_body = (await late.json())["error"]
        assert late.status == 410 and error_body["code"] == "pairing_code_expired"
        assert "expired at" in error_body["message"] and "they get a new code" in error_body["message"]
        assert tree_digest(tmp_path) == before
        states = {p["code"]: p["state"] for p in (await (await client.get("/v1/channels/pairings")).json())["pairings"]}
        assert states == {second: "expired"}
        await write("and now?")
        third = code_in(said()[-1])  # the expired code is replaced on the next message
        assert third not in (code, second)
        assert gateway[answer_check.MISMATCHES] == []


class Notices:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.up = True

    async def __call__(self, target: Target, text: str) -> bool:
        if self.up:
            self.sent.append((target.chat_id, text))
        return self.up


async def test_an_approval_made_while_the_account_was_stopped_is_told_at_its_next_start(
    tmp_path: Path, clock: FakeClock
) -> None:
    store = ChannelStore.for_home(tmp_path)
    notices = Notices()
    settings = SlackAccount(dm_policy="pairing")
    access = DirectAccess("slack", "work", settings, store, clock=clock, notify=notices, noun="app")
    await access.load()
    dm = Inbound("slack", "work", "main", "direct", "D9", ANN, "hi", "Ev1", Target("D9"))
    assert not await access.admitted(dm)
    code = code_in(notices.sent[0][1])
    await store.approve(code, clock())  # as `neotask channels approve` does with no daemon running
    notices.up = False
    again = DirectAccess("slack", "work", settings, store, clock=clock, notify=notices, noun="app")
    await again.load()  # the platform does not take the notice: it stays owed
    assert await again.admitted(dm)
    notices.up = True
    restarted = DirectAccess("slack", "work", settings, store, clock=clock, notify=notices, noun="app")
    await restarted.load()
    await restarted.load()
    assert notices.sent[1:] == [("D9", "You are approved: this app takes your messages now.")]
    await store.close()


async def test_a_channels_db_of_an_older_version_is_brought_up_to_date(tmp_path: Path, clock: FakeClock) -> None:
    """Its pending codes count as expired (their lifetime is unknown), its approved senders as told."""
    path = tmp_path / "channels.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute(OLD_TABLE)
        db.execute("INSERT INTO pairing VALUES ('AAAA2222', 'slack', 'work', 'U1', NULL, ?, NULL)", (iso(clock()),))
        db.execute("INSERT INTO pairing VALUES ('BBBB3333', 'slack', 'work', 'U2', NULL, ?, ?)",
                   (iso(clock()), iso(clock())))  # fmt: skip
        db.commit()
    store = ChannelStore.for_home(tmp_path)
    states = {p.code: p.state(clock()) for p in await store.pairings()}
    assert states == {"AAAA2222": "expired", "BBBB3333": "approved"}
    assert await store.unwelcomed("slack", "work") == []
    assert await store.approved("slack", "work") == {"U2"}
    await store.close()


@pytest.mark.realtime  # the CLI reads the real clock
async def test_the_cli_lists_approves_and_revokes_offline_and_refuses_bad_codes_without_writing(
    tmp_path: Path, capsys: Any
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    cli = Cli(capsys, home)
    assert (await cli("channels", "pairings"))[:2] == (0, "no pairing codes (dm_policy: pairing gives one to each"
                                                          " unknown sender)\n")  # fmt: skip
    for action, code, error in (("approve", "0O1I", "invalid_field"), ("revoke", "WXYZ2345", "pairing_code_not_found"),
                                ("approve", "WXYZ2345", "pairing_code_not_found")):  # fmt: skip
        status, _, err = await cli("channels", action, code)
        assert status == 1 and f"error: {error}: " in err, err
    assert not (home / "channels.db").exists()  # a home without one is not given one

    store = ChannelStore.for_home(home)
    now = system_clock()
    given, _ = await store.pairing_code("slack", "work", ANN, "Ann", "D1", now=now, lifetime=timedelta(days=1))
    await store.close()
    status, out, _ = await cli("channels", "pairings")
    assert status == 0 and given.code in out and "pending" in out and "Ann" in out
    status, out, _ = await cli("channels", "approve", given.code)
    assert status == 0 and "now takes messages from U0ANN (Ann)" in out and "told through the channel when" in out
    approved = (await cli.json("channels", "pairings", "--state", "approved"))["pairings"]
    assert [p["state"] for p in approved] == ["approved"]
    revoked = await cli.json("channels", "revoke", given.code)
    assert revoked["revoked"] is True and revoked["state"] == "approved"
    assert (await cli.json("channels", "pairings"))["pairings"] == []
