"""Matrix against a real Synapse (``tests/support/synapse.py``): started once for this file (so
with ``--dist loadfile`` one worker starts it), users registered with the shared secret, and the
gateway's Matrix account talking to it through matrix-nio as it would to matrix.org.

In-process (the gateway app, the local model server): a direct room and a group room joined on an
owner's invite, a stranger's invite rejected, the keys (``!``, ``:``, ``@`` and ``$`` in them)
through the API, mention gating, a thread, a chat command answered without a model call, an
encrypted room told once, a refused token beside an account that runs (at start, and revoked while it
runs), a real 429, an end-to-end encrypted room read and answered (also after a restart). A real daemon:
kill -9 with a message sent while it is down, then a restart (nothing answered twice, nothing
missed)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote
from uuid import uuid4

import pytest
import yaml

from channels.matrix import ENCRYPTED_NOTICE, UNDECRYPTABLE_NOTICE
from gateway import keys as K
from tests.channels.harness import connected, connected_in, daemon, stored, wait_until
from tests.conftest import FakeClock
from tests.gateway.daemons import child_env, run_cli
from tests.gateway.helpers import make_app
from tests.support import synapse
from tests.support.openai_server import Hang, OpenAIServer
from tests.support.synapse import Synapse, User

# slow: a real homeserver process (make test-fast leaves it out)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(synapse.available() is not None, reason=str(synapse.available()))]


@pytest.fixture(scope="session")
def homeserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synapse]:
    server = Synapse(tmp_path_factory.mktemp("synapse"))
    try:
        server.start()
        print(f"\nsynapse started in {server.started_in_s:.1f} s")
        yield server
    finally:
        server.stop()


_names = iter(range(1_000_000))


def _name(prefix: str) -> str:
    return f"{prefix}{next(_names)}{os.getpid()}"


def _account(hs: Synapse, bot: User, **more: Any) -> dict[str, Any]:
    return {"homeserver": hs.url, "user_id": bot.user_id, "access_token_env": "MX_MAIN", "sync_timeout_s": 1, **more}


def _overrides(accounts: dict[str, Any]) -> dict[str, Any]:
    return {"channels": {"matrix": {"accounts": accounts}}, "session": {"dm_scope": "per-channel-peer"}}


async def _answers(user: User, room: str, bot: User, count: int, timeout: float = 30) -> list[dict[str, Any]]:
    """The bot's messages in the room once there are ``count`` of them."""

    async def enough() -> list[dict[str, Any]] | None:
        found = await user.messages(room, bot.user_id)
        return found if len(found) >= count else None

    return list(await wait_until(enough, timeout))


async def _joined(user: User, room: str, who: str) -> None:
    await wait_until(lambda: _has_member(user, room, who), 30)


async def _has_member(user: User, room: str, who: str) -> bool:
    return who in await user.members(room)


async def _register(hs: Synapse, *names: str, **how: Any) -> list[User]:
    """New users (off the event loop: the admin API is called with urllib)."""
    return [await asyncio.to_thread(hs.register, _name(n), **how) for n in names]


def _segment(key: str) -> str:
    return quote(key, safe="")  # one path segment: ':' as %3A, '%' as %25 (gateway/client.py's key_segment)


async def test_rooms_keys_mentions_threads_commands_and_strangers(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, homeserver: Synapse
) -> None:
    [bot] = await _register(homeserver, "neo", displayname="NeoBot")
    alice, bob, carol = await _register(homeserver, "alice", "bob", "carol")
    async with OpenAIServer() as model:
        account = _account(homeserver, bot, allow_from=[alice.user_id], dm_policy="allowlist")
        app = make_app(tmp_path, clock, _overrides({"main": account}), base_url=model.base_url,
                       env={"MX_MAIN": bot.token})  # fmt: skip
        client = await aiohttp_client(app)
        await connected_in(client, "main")

        # a direct room: joined on the owner's invite, answered in HTML with the plain body beside it
        dm = await alice.room(bot.user_id, direct=True)
        await _joined(alice, dm, bot.user_id)
        await alice.say(dm, "hello **there**")
        [answer] = await _answers(alice, dm, bot, 1)
        assert answer["content"]["body"] == "echo: hello **there**"
        assert answer["content"]["formatted_body"] == "echo: hello <b>there</b>"
        assert answer["content"]["format"] == "org.matrix.custom.html"
        dm_key = f"agent:main:matrix:dm:{alice.user_id.replace(':', '%3A')}"
        entry = await (await client.get(f"/v1/sessions/{_segment(dm_key)}")).json()
        assert entry["key"] == dm_key, entry

        # chat commands: answered in place, no model call
        asked = len(model.chat_requests)
        await alice.say(dm, "/status")
        status = (await _answers(alice, dm, bot, 2))[-1]["content"]["body"]
        assert dm_key in status or "Session" in status, status
        assert len(model.chat_requests) == asked
        await alice.say(dm, "/new")  # (ending the session may summarize it: the model writes the summary)
        fresh = (await _answers(alice, dm, bot, 3))[-1]["content"]["body"]
        assert "new" in fresh.casefold() or "session" in fresh.casefold(), fresh

        # typing: shown while the model writes
        release = asyncio.Event()
        model.script(Hang(30, until=release))
        await alice.say(dm, "take your time")

        async def typing() -> bool:
            synced = await alice.call("GET", "/sync?timeout=0")
            events = synced["rooms"]["join"].get(dm, {}).get("ephemeral", {}).get("events", [])
            return any(e["type"] == "m.typing" and bot.user_id in e["content"]["user_ids"] for e in events)

        await wait_until(typing, 30)
        release.set()
        assert (await _answers(alice, dm, bot, 4))[-1]["content"]["body"] == "echo: take your time"
        asked = len(model.chat_requests)
        await alice.say(dm, "/compact")  # answered in place (two messages in this run: nothing to compact)
        compacted = (await _answers(alice, dm, bot, 5))[-1]["content"]["body"]
        assert compacted.startswith("Nothing to compact yet"), compacted
        assert len(model.chat_requests) == asked
        await alice.say(dm, "/reset")
        reset = (await _answers(alice, dm, bot, 6))[-1]["content"]["body"]
        assert reset.startswith("Session reset."), reset

        # a group room (the owner invites the bot and bob): answered only when mentioned
        group = await alice.room(bot.user_id, bob.user_id)
        await bob.join(group)
        await _joined(alice, group, bot.user_id)
        chatting = await bob.say(group, "just chatting")
        await bob.say(group, "what do you think, NeoBot?")  # the display name in the text
        await bob.say(group, "and you?", mention=bot.user_id)  # a pill: m.mentions
        await _answers(alice, group, bot, 2)
        await app[K.CHANNELS].idle()
        assert [a["content"]["body"] for a in await alice.messages(group, bot.user_id)] == [
            "echo: what do you think, NeoBot?", "echo: and you?"]  # fmt: skip
        group_key = f"agent:main:matrix:channel:{group.replace('!', '%21').replace(':', '%3A')}"
        lines = await (await client.get(f"/v1/sessions/{_segment(group_key)}")).json()
        assert lines["key"] == group_key

        # a thread: its own session, answered in the thread
        root = await alice.say(group, "a topic for NeoBot")
        await _answers(alice, group, bot, 3)
        await alice.say(group, "more on it, NeoBot", thread=root)
        threaded = (await _answers(alice, group, bot, 4))[-1]
        assert threaded["content"]["body"] == "echo: more on it, NeoBot"
        assert threaded["content"]["m.relates_to"]["rel_type"] == "m.thread"
        assert threaded["content"]["m.relates_to"]["event_id"] == root
        thread_key = f"{group_key}:thread:{root.replace('$', '%24')}"
        thread_entry = await (await client.get(f"/v1/sessions/{_segment(thread_key)}")).json()
        assert thread_entry["key"] == thread_key, thread_entry

        # a stranger's invite (allowlist): rejected, nothing stored
        stranger_dm = await carol.room(bot.user_id, direct=True)
        await carol.say(stranger_dm, "hi bot")

        async def rejected() -> bool:
            state = await carol.call("GET", f"/rooms/{quote(stranger_dm)}/state/m.room.member/{quote(bot.user_id)}")
            return bool(state.get("membership") == "leave")

        await wait_until(rejected, 30)
        carol_key = f"agent:main:matrix:dm:{carol.user_id.replace(':', '%3A')}"
        assert (await client.get(f"/v1/sessions/{_segment(carol_key)}")).status == 404

        # an edit that now mentions the bot, of a message never stored: taken as a new message that does
        new = {"msgtype": "m.text", "body": "just chatting, NeoBot?"}
        relation = {"rel_type": "m.replace", "event_id": chatting}
        edit = {"msgtype": "m.text", "body": "* just chatting, NeoBot?", "m.relates_to": relation, "m.new_content": new}
        await bob.call("PUT", f"/rooms/{quote(group)}/send/m.room.message/{_name('edit')}", edit)
        assert (await _answers(alice, group, bot, 5))[-1]["content"]["body"] == "echo: just chatting, NeoBot?"

        # the status: the account, its bot, what it took in and sent
        accounts = (await (await client.get("/v1/channels")).json())["accounts"]
        [main] = [a for a in accounts if a["channel"] == "matrix"]
        assert main["connected"] and main["username"] == bot.user_id[1:]
        assert main["messages_in"] == 11 and main["messages_out"] == 11, main  # with /compact and /reset


async def test_an_encrypted_room_is_told_once_and_a_refused_token_stops_only_its_account(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, homeserver: Synapse, caplog: pytest.LogCaptureFixture
) -> None:
    bot, alice = await _register(homeserver, "neo", "alice")
    async with OpenAIServer() as model:
        accounts = {"main": _account(homeserver, bot, allow_from=[alice.user_id], encryption=False),
                    "broken": _account(homeserver, bot, access_token_env="MX_BROKEN")}  # fmt: skip
        app = make_app(tmp_path, clock, _overrides(accounts), base_url=model.base_url,
                       env={"MX_MAIN": bot.token, "MX_BROKEN": "syt_not_a_token"})  # fmt: skip
        client = await aiohttp_client(app)
        await connected_in(client, "main")
        room = await alice.room(bot.user_id, direct=True, encrypted=True)
        await _joined(alice, room, bot.user_id)
        ciphertext = {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgAEnACgAkL", "sender_key": "x",
                      "session_id": "y", "device_id": "D"}  # fmt: skip
        for _ in range(2):
            await alice.call("PUT", f"/rooms/{quote(room)}/send/m.room.encrypted/{_name('t')}", ciphertext)
        [notice] = await _answers(alice, room, bot, 1)
        assert notice["content"] == {"msgtype": "m.notice", "body": ENCRYPTED_NOTICE}
        await alice.say(room, "and in clear?")  # a clear message in the room is still answered
        await _answers(alice, room, bot, 2)
        assert [m["content"]["body"] for m in await alice.messages(room, bot.user_id)].count(ENCRYPTED_NOTICE) == 1
        listed = {a["account"]: a for a in (await (await client.get("/v1/channels")).json())["accounts"]}
        assert listed["main"]["encrypted_rooms"] == [room]
        assert "encrypted" in listed["main"]["last_error"]
        broken = listed["broken"]
        assert not broken["connected"] and "refused the token in MX_BROKEN" in broken["last_error"]
        assert "M_UNKNOWN_TOKEN" in broken["last_error"] and "syt_not_a_token" not in json.dumps(listed)
        assert listed["main"]["connected"]
        refused = [r for r in caplog.records if r.levelname == "ERROR" and "matrix account broken" in r.getMessage()]
        assert len(refused) == 1 and "the others keep running" in refused[0].getMessage()
        encrypted = [r for r in caplog.records if "end-to-end encrypted" in r.getMessage()]
        assert len(encrypted) == 1 and room in encrypted[0].getMessage()


async def test_a_token_revoked_while_running_stops_its_account_with_one_line_the_other_answers(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, homeserver: Synapse, caplog: pytest.LogCaptureFixture
) -> None:
    revoked, other, alice = await _register(homeserver, "neo", "neo", "alice")
    async with OpenAIServer() as model:
        accounts = {"main": _account(homeserver, revoked, allow_from=[alice.user_id], encryption=False),
                    "other": _account(homeserver, other, access_token_env="MX_OTHER", allow_from=[alice.user_id],
                                      encryption=False)}  # fmt: skip
        app = make_app(tmp_path, clock, _overrides(accounts), base_url=model.base_url,
                       env={"MX_MAIN": revoked.token, "MX_OTHER": other.token})  # fmt: skip
        client = await aiohttp_client(app)
        await connected_in(client, "main")
        await connected_in(client, "other")
        await revoked.call("POST", "/logout", {})  # the bot's session logged out (as Element's "sign out" does)

        async def stopped() -> dict[str, Any] | None:
            listed = {a["account"]: a for a in (await (await client.get("/v1/channels")).json())["accounts"]}
            return listed if not listed["main"]["connected"] and listed["main"]["last_error"] else None

        listed = await wait_until(stopped, 30)
        assert "/sync refused the token in MX_MAIN" in listed["main"]["last_error"], listed["main"]
        assert "M_UNKNOWN_TOKEN" in listed["main"]["last_error"] and revoked.token not in json.dumps(listed)
        room = await alice.room(other.user_id, direct=True)  # the other account keeps answering
        await _joined(alice, room, other.user_id)
        await alice.say(room, "still there?")
        assert [m["content"]["body"] for m in await _answers(alice, room, other, 1)] == ["echo: still there?"]
        refused = [r for r in caplog.records if r.levelname == "ERROR" and "matrix account main" in r.getMessage()]
        assert len(refused) == 1 and "the others keep running" in refused[0].getMessage(), refused


async def test_pairing_joins_a_strangers_direct_room_and_lets_them_in_once_approved(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, homeserver: Synapse
) -> None:
    bot, carol, dave = await _register(homeserver, "neo", "carol", "dave")
    async with OpenAIServer() as model:
        app = make_app(tmp_path, clock, _overrides({"main": _account(homeserver, bot, dm_policy="pairing")}),
                       base_url=model.base_url, env={"MX_MAIN": bot.token})  # fmt: skip
        client = await aiohttp_client(app)
        await connected_in(client, "main")
        room = await carol.room(bot.user_id, direct=True)  # a direct invite from a stranger: joined
        await _joined(carol, room, bot.user_id)
        await carol.say(room, "hello?")
        [notice] = await _answers(carol, room, bot, 1)
        code = notice["content"]["body"].split("Pairing code: ")[1].split()[0]
        approved = await client.post("/v1/channels/approve", json={"code": code})
        assert approved.status == 200, await approved.text()
        await _answers(carol, room, bot, 2)  # "You are approved"
        await carol.say(room, "now?")
        assert (await _answers(carol, room, bot, 3))[-1]["content"]["body"] == "echo: now?"
        group = await dave.room(bot.user_id)  # a group invite from a stranger under pairing: rejected

        async def rejected() -> bool:
            state = await dave.call("GET", f"/rooms/{quote(group)}/state/m.room.member/{quote(bot.user_id)}")
            return bool(state.get("membership") == "leave")

        await wait_until(rejected, 30)


async def test_a_429_is_waited_out_and_a_long_reply_arrives_whole_in_order(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, homeserver: Synapse, caplog: pytest.LogCaptureFixture
) -> None:
    [bot] = await _register(homeserver, "slow", limited=True)  # the homeserver's rate limit applies to it
    [alice] = await _register(homeserver, "alice")
    async with OpenAIServer() as model:
        app = make_app(tmp_path, clock, _overrides({"main": _account(homeserver, bot, allow_from=[alice.user_id])}),
                       base_url=model.base_url, env={"MX_MAIN": bot.token})  # fmt: skip
        client = await aiohttp_client(app)
        app[K.CHANNELS].connectors[("matrix", "main")].limit = 400  # type: ignore[attr-defined]
        await connected_in(client, "main")
        room = await alice.room(bot.user_id, direct=True)
        await _joined(alice, room, bot.user_id)
        paragraphs = [f"paragraph {i} " + " ".join(["word"] * 30) for i in range(4)]
        await alice.say(room, "\n\n".join(paragraphs))
        await _answers(alice, room, bot, 4, timeout=60)  # a burst of 2, then one a second: 429s in between
        await app[K.CHANNELS].idle()
        parts = await alice.messages(room, bot.user_id)
        text = "\n\n".join(p["content"]["body"] for p in parts)
        assert text == "echo: " + "\n\n".join(paragraphs)  # every part once, in order
        assert all(len(p["content"]["body"]) + len(p["content"]["formatted_body"]) <= 400 for p in parts)
        with sqlite3.connect(tmp_path / "channels.db") as db:
            [(attempts, state)] = db.execute("SELECT attempts, state FROM outbox").fetchall()
        assert attempts >= 1 and state == "sent"
        waits = [r.getMessage() for r in caplog.records if "M_LIMIT_EXCEEDED" in r.getMessage()]
        assert waits and all("trying again in" in w for w in waits), waits


async def test_more_messages_than_a_sync_holds_are_paged_back_none_missed(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, homeserver: Synapse
) -> None:
    bot, alice = await _register(homeserver, "neo", "alice")
    async with OpenAIServer() as model:
        app = make_app(tmp_path, clock, _overrides({"main": _account(homeserver, bot, allow_from=[alice.user_id])}),
                       base_url=model.base_url, env={"MX_MAIN": bot.token})  # fmt: skip
        client = await aiohttp_client(app)
        await connected_in(client, "main")
        intake = app[K.CHANNELS]
        room = await alice.room(bot.user_id, direct=True)
        await _joined(alice, room, bot.user_id)
        connector = intake.connectors[("matrix", "main")]
        await connector.stop()  # away: five messages come in, a sync holds two
        for i in range(5):
            await alice.say(room, f"m{i}")
        connector.timeline_limit = 2  # type: ignore[attr-defined]
        await connector.start(intake.post)
        await _answers(alice, room, bot, 5, timeout=60)  # five turns one after another: a loaded suite took over 30 s
        await intake.idle()
        answers = [m["content"]["body"] for m in await alice.messages(room, bot.user_id)]
        assert answers == [f"echo: m{i}" for i in range(5)]


# -- end-to-end encryption ------------------------------------------------------------------------


class Olm:
    """A user's own Matrix client with end-to-end encryption (nio with its e2e extra, as the bot),
    its keys in ``folder``: sends encrypted and reads what it was sent, decrypted."""

    def __init__(self, hs: Synapse, user: User, folder: Path) -> None:
        from nio import AsyncClient, AsyncClientConfig
        from nio.store import SqliteStore

        folder.mkdir(parents=True, exist_ok=True)
        config = AsyncClientConfig(encryption_enabled=True, store=SqliteStore, store_sync_tokens=False)
        self.client = AsyncClient(hs.url, user.user_id, store_path=str(folder), config=config)
        self.user = user
        self.clear: list[Any] = []  # the decrypted messages read, oldest first

    async def __aenter__(self) -> Olm:
        self.client.access_token = self.user.token
        me = await self.client.whoami()
        self.client.restore_login(self.user.user_id, me.device_id, self.user.token)
        assert (await self.client.keys_upload()).__class__.__name__ == "KeysUploadResponse"
        await self.read()  # the rooms so far
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()

    async def read(self) -> None:
        from nio import RoomMessageNotice, RoomMessageText, SyncResponse

        synced = await self.client.sync(timeout=0, full_state=not self.client.next_batch)
        assert isinstance(synced, SyncResponse), synced
        for joined in synced.rooms.join.values():
            self.clear += [e for e in joined.timeline.events if isinstance(e, RoomMessageText | RoomMessageNotice)]
        if self.client.should_query_keys:
            await self.client.keys_query()

    async def say(self, room: str, text: str) -> None:
        await self.read()
        sent = await self.client.room_send(room, "m.room.message", {"msgtype": "m.text", "body": text},
                                           ignore_unverified_devices=True)  # fmt: skip
        assert sent.__class__.__name__ == "RoomSendResponse", sent

    async def withheld(self, room: str, text: str) -> Callable[[], Awaitable[None]]:
        """Send ``text`` encrypted with a new room key that is not sent yet; the function that sends it."""
        from nio import Api

        client, olm = self.client, self.client.olm
        assert olm is not None
        await self.read()
        olm.create_outbound_group_session(room)
        payloads = list(olm.share_group_session_parallel(room, list(client.rooms[room].users),
                                                          ignore_unverified_devices=True))  # fmt: skip
        olm.outbound_group_sessions[room].shared = True  # (it is not: room_send must not share it now)
        await self.say(room, text)

        async def send_key() -> None:
            for _, to_device in payloads:
                method, path, data = Api.to_device(client.access_token, "m.room.encrypted", to_device, uuid4())
                response = await client.send(method, path, data)
                assert response.status == 200, await response.text()
                response.release()

        return send_key

    async def answers(self, bot: User, count: int) -> list[str]:
        async def enough() -> list[str] | None:
            await self.read()
            found = [e.body for e in self.clear if e.sender == bot.user_id]
            return found if len(found) >= count else None

        return list(await wait_until(enough, 60))


async def _server_types(user: User, room: str, sender: str) -> list[str]:
    """The types of ``sender``'s timeline events as the homeserver holds them."""
    found = await user.call("GET", f"/rooms/{quote(room)}/messages?dir=b&limit=100")
    return [e["type"] for e in reversed(found["chunk"]) if e["sender"] == sender and "state_key" not in e]


async def test_an_encrypted_room_is_read_and_answered_encrypted_also_after_a_restart(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, homeserver: Synapse, caplog: pytest.LogCaptureFixture
) -> None:
    bot, alice = await _register(homeserver, "neo", "alice")
    home = tmp_path / "home"
    account = _overrides({"main": _account(homeserver, bot, allow_from=[alice.user_id])})
    async with OpenAIServer() as model, Olm(homeserver, alice, tmp_path / "alice-keys") as olm:
        client = await aiohttp_client(make_app(home, clock, account, base_url=model.base_url,
                                               env={"MX_MAIN": bot.token}))  # fmt: skip
        await connected_in(client, "main")
        room = await alice.room(bot.user_id, direct=True, encrypted=True)
        await _joined(alice, room, bot.user_id)
        await olm.say(room, "a secret **hello**")
        assert await olm.answers(bot, 1) == ["echo: a secret **hello**"]  # the answer, decrypted by alice
        assert await _server_types(alice, room, bot.user_id) == ["m.room.encrypted"]  # nothing in clear
        assert await _server_types(alice, room, alice.user_id) == ["m.room.encrypted"]
        [status] = [a for a in (await (await client.get("/v1/channels")).json())["accounts"] if a["account"] == "main"]
        assert status["encryption"] == "on" and status["encrypted_rooms"] == [], status

        # a message whose key never reached the bot: logged once, the room told once (per megolm session)
        bogus = {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgAEnACgAkL", "sender_key": "x",
                 "session_id": "lost", "device_id": "D"}  # fmt: skip
        for _ in range(2):
            await alice.call("PUT", f"/rooms/{quote(room)}/send/m.room.encrypted/{_name('t')}", bogus)
        assert (await olm.answers(bot, 2))[1] == UNDECRYPTABLE_NOTICE
        told = [r for r in caplog.records if "could not be decrypted" in r.getMessage()]
        assert len(told) == 1 and room in told[0].getMessage()

        # the crypto store: under the home, private, and kept across a restart of the gateway
        folder = home / "matrix" / "main"
        assert folder.stat().st_mode & 0o777 == 0o700
        files = list(folder.iterdir())
        assert files and all(f.stat().st_mode & 0o777 == 0o600 for f in files), files
        await client.close()
        asked = len(model.chat_requests)
        await olm.say(room, "while you were away")  # the same megolm session: its key is in the bot's store
        client = await aiohttp_client(make_app(home, clock, account, base_url=model.base_url,
                                               env={"MX_MAIN": bot.token}))  # fmt: skip
        await connected_in(client, "main")
        assert (await olm.answers(bot, 3))[2] == "echo: while you were away"
        olm.client.invalidate_outbound_session(room)  # a new room key, sent to the bot's (kept) device keys
        await olm.say(room, "a new session")
        assert (await olm.answers(bot, 4))[3] == "echo: a new session"
        assert len(model.chat_requests) == asked + 2
        assert await _server_types(alice, room, bot.user_id) == ["m.room.encrypted"] * 4
        assert sum("could not be decrypted" in r.getMessage() for r in caplog.records) == 1

        # a room key that comes a sync after its message: the room is told, then the message is read,
        # also when the gateway restarted in between
        send_key = await olm.withheld(room, "my key comes later")
        assert (await olm.answers(bot, 5))[4] == UNDECRYPTABLE_NOTICE
        await client.close()
        client = await aiohttp_client(make_app(home, clock, account, base_url=model.base_url,
                                               env={"MX_MAIN": bot.token}))  # fmt: skip
        await connected_in(client, "main")
        await send_key()
        assert (await olm.answers(bot, 6))[5] == "echo: my key comes later"


# -- a real daemon: kill -9 and a restart --------------------------------------------------------


def _config(tmp_path: Path, hs: Synapse, bot: User, owner: User, model: OpenAIServer) -> Path:
    data = _overrides({"main": _account(hs, bot, allow_from=[owner.user_id])})
    data["agents"] = {"main": {"model": {"base_url": model.base_url, "name": "m", "max_retries": 0, "timeout_s": 60}}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.realtime
@pytest.mark.timeout(240)
async def test_kill_9_and_a_restart_answer_everything_once(tmp_path: Path, homeserver: Synapse) -> None:
    bot, alice = await _register(homeserver, "neo", "alice")
    home = tmp_path / "home"
    key = f"agent:main:matrix:dm:{alice.user_id.replace(':', '%3A')}"
    async with OpenAIServer() as model:
        config = _config(tmp_path, homeserver, bot, alice, model)
        env = child_env(MX_MAIN=bot.token)
        async with daemon(home, "--config", str(config), env=env) as gw:
            await wait_until(lambda: connected(gw.url, "main"), 60)
            room = await alice.room(bot.user_id, direct=True)
            await _joined(alice, room, bot.user_id)
            await alice.say(room, "one")
            await _answers(alice, room, bot, 1)
            gw.proc.send_signal(signal.SIGKILL)
            await gw.proc.wait()
        # killed between the answer (stored) and its send: the next start sends it, once, unasked again
        async with daemon(home, "--config", str(config), env={**env, "_NEOTASK_CRASH_AT": "channels.answered"}) as gw:
            await alice.say(room, "zero (killed before its answer went out)")
            assert await gw.wait(timeout=60) == -9
        assert len(await alice.messages(room, bot.user_id)) == 1 and len(model.chat_requests) == 2
        await alice.say(room, "two (while the gateway is down)")
        await alice.say(room, "three (while the gateway is down)")
        async with daemon(home, "--config", str(config), env=env) as gw:  # the restart
            await _answers(alice, room, bot, 4, timeout=60)
            await alice.say(room, "four")
            await _answers(alice, room, bot, 5, timeout=60)
            await asyncio.sleep(2)  # a sync or two more: nothing answered again
            shown = await run_cli("sessions", "show", key, "--home", str(home), "--json", env=env)
            assert shown.returncode == 0 and json.loads(shown.stdout)["key"] == key, shown  # the key through the CLI
            await gw.stop()
        answers = [m["content"]["body"] for m in await alice.messages(room, bot.user_id)]
        down = ["two (while the gateway is down)", "three (while the gateway is down)"]
        zero = "zero (killed before its answer went out)"
        assert answers == [f"echo: {t}" for t in ["one", zero, *down, "four"]]
        assert len(model.chat_requests) == 5  # the stored answer to "zero" was sent, not asked again
        users = [line["content"] for line in stored(home, key) if line.get("role") == "user"]
        assert users == ["one", zero, *down, "four"]


@pytest.mark.realtime
@pytest.mark.timeout(300)
async def test_the_ingest_bench_runs_quick_on_this_homeserver(
    homeserver: Synapse, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench.matrix_ingest --quick against the suite's Synapse (a second homeserver would cost its
    start): every message of both paths stored."""
    from bench import matrix_ingest

    status = await matrix_ingest.run_synapse(60, 4, 1, homeserver=homeserver)
    out = capsys.readouterr().out
    assert "PASS  stored messages missing: 0" in out, out
    assert status in (0, 1)  # 1 only says the speed target was missed on this machine
