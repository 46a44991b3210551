"""The Matrix connector against the benchmark's stand-in homeserver (tests/support/matrix_server.py):
the stand-in speaks what the connector calls (an invite joined, a timeline over the filter's limit
paged back, a token asked past the last message once all are durable, a send kept once per
transaction, typing), so the benchmark's figure is the connector's."""

from __future__ import annotations

import json
from pathlib import Path

from channels.matrix import MatrixConnector
from channels.matrix_events import DIRECT
from channels.matrix_format import content
from channels.protocol import Inbound, Target
from channels.store import ChannelStore
from config.channels import MatrixAccount
from tests.conftest import FakeClock
from tests.support.matrix_server import Event, MatrixServer

BOT, TOKEN = "@bot:localhost", "syt_standin"


async def test_the_connector_joins_pages_back_stores_every_message_once_and_sends(
    tmp_path: Path, clock: FakeClock
) -> None:
    async with MatrixServer(BOT, TOKEN) as server:
        server.record = True
        account = MatrixAccount(homeserver=server.url, user_id=BOT, dm_policy="open", encryption=False,
                                sync_timeout_s=1)  # fmt: skip
        connector = MatrixConnector("main", account, TOKEN, ChannelStore(tmp_path / "c.db"), clock=clock)
        posted: list[Inbound] = []

        async def post(message: Inbound) -> None:
            posted.append(message)

        room = server.add_room("@alice:localhost")
        await connector.start(post)
        try:
            await server.wait_for(lambda: room.joined and server.confirmed >= room.invited_at, 10)
            assert connector._kinds[room.room_id] == DIRECT
            server.prepare("t", 250, [room])  # more than a sync's timeline holds (100): paged back
            last = await server.release()
            await server.wait_for(lambda: server.confirmed >= last, 20)
            assert [m.text for m in posted] == [f"message {n} of t: the quick brown fox" for n in range(250)]
            assert {m.sender_id for m in posted} == {"@alice:localhost"} and posted[0].chat_type == "direct"
            target = Target(room.room_id, reply_to=posted[-1].update_id)
            [part] = connector.render("**hello**")
            await connector.send_part(target, part)
            await connector.send_part(target, part)  # sent again after a crash: the same transaction
            await connector.typing(target)
        finally:
            await connector.stop()
        sent = [e for e in server.stream[last:] if isinstance(e, Event)]
        assert len(sent) == 1 and json.loads(sent[0].text)["sender"] == BOT
        assert json.loads(sent[0].text)["content"] == content(part)
        assert connector.status.messages_in == 250
        assert any(c.path.endswith("/messages") for c in server.calls)  # the paging back
        assert any("/typing/" in c.path for c in server.calls)
