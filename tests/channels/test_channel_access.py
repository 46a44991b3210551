"""``dm_policy`` for every connector (``channels/access.py``) on a real ``channels.db``, and who
may run the chat commands that change a session's settings."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from channels.access import DirectAccess, command_refusal
from channels.protocol import Inbound, Target
from channels.store import ChannelStore
from config.channels import SlackAccount, TelegramAccount
from conversations.commands import commands_in
from tests.conftest import FakeClock

REFUSED = "Sorry, only the owner or an admin can use /{} here."


def message(sender: str, name: str | None = None) -> Inbound:
    return Inbound("slack", "work", "main", "direct", f"D{sender}", sender, "hi", f"Ev{sender}", Target(f"D{sender}"),
                   sender_name=name)  # fmt: skip


class Notices:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    async def __call__(self, target: Target, text: str) -> bool:
        self.sent.append((target.chat_id, text))
        return True


def broken(store_path: Path) -> None:
    """``channels.db`` can no longer be opened (a directory where the file was)."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store_path}{suffix}").unlink(missing_ok=True)
    store_path.mkdir()


async def test_an_approved_sender_is_admitted_from_memory_even_when_channels_db_cannot_be_read(
    tmp_path: Path, clock: FakeClock
) -> None:
    store = ChannelStore.for_home(tmp_path)
    notices = Notices()
    access = DirectAccess("slack", "work", SlackAccount(dm_policy="pairing"), store, clock=clock, notify=notices,
                          noun="app")  # fmt: skip
    await access.load()
    assert not await access.admitted(message("U1", "Ann"))  # unknown: a code, nothing stored
    [(chat, notice)] = notices.sent
    code = notice.split("Pairing code: ")[1].split()[0]
    assert chat == "DU1" and notice.startswith("This app does not know you yet.")
    assert (await store.pairings())[0].sender_name == "Ann"
    assert not await access.admitted(message("U1"))  # the same code, not sent again
    assert len(notices.sent) == 1
    pairing = await store.approve(code.lower(), clock())
    assert pairing.sender_id == "U1"
    assert await access.admitted(message("U1"))  # approved since: read from the table once
    await store.close()
    broken(store.path)
    assert await access.admitted(message("U1"))  # from memory: the table is not read again
    with pytest.raises(OSError):
        await access.admitted(message("U2"))  # an unknown sender needs the table
    shutil.rmtree(store.path)


@pytest.mark.parametrize(
    ("policy", "admitted"),
    [("open", {"U1", "U9"}), ("allowlist", {"U1"}), ("pairing", {"U1"})],
)
async def test_each_policy_admits_whom_it_says(
    tmp_path: Path, clock: FakeClock, policy: str, admitted: set[str]
) -> None:
    notices = Notices()
    settings = TelegramAccount(dm_policy=policy, allow_from=["U1"])  # type: ignore[arg-type]
    access = DirectAccess("telegram", "main", settings, ChannelStore.for_home(tmp_path), clock=clock, notify=notices)
    await access.load()
    assert {s for s in ("U1", "U9") if await access.admitted(message(s))} == admitted
    assert len(notices.sent) == (1 if policy == "pairing" else 0)
    assert all(text.startswith("This bot does not know you yet.") for _, text in notices.sent)


@pytest.mark.parametrize(
    ("text", "sender", "chat_type", "own_session", "refused"),
    [
        ("/model gpt-5-expensive", "901", "group", False, "model"),
        ("/model", "901", "group", False, None),  # only shows the model
        ("/\uff50\uff41\uff55\uff53\uff45", "901", "group", False, "pause"),  # full-width: what the engine runs
        ("/new /pause", "901", "group", False, "pause"),  # the text after /new runs as the next message
        ("/reset hello", "901", "group", False, None),
        ("/status", "901", "channel", False, None),
        ("/stop", "901", "channel", False, "stop"),
        ("/uncompact", "901", "group", False, "uncompact"),
        ("/resume", "901", "group", False, "resume"),
        ("/pause", "555", "group", False, None),  # the owner
        ("/pause", "777", "group", False, None),  # an admin
        ("/pause", "901", "direct", True, None),  # their own session
        ("/pause", "901", "direct", False, "pause"),  # a direct chat routed to the owner's session
    ],
)
def test_who_may_run_a_command_that_changes_the_session(
    text: str, sender: str, chat_type: Any, own_session: bool, refused: str | None
) -> None:
    account = TelegramAccount(allow_from=["555"], commands={"allow_from": [777]})  # type: ignore[arg-type]
    got = command_refusal(commands_in(text), sender, chat_type, account, own_session=own_session)
    assert got == (REFUSED.format(refused) if refused else None)
    stricter = TelegramAccount(allow_from=["555"], commands={"restricted": ["/new", "compact"]})  # type: ignore[arg-type]
    assert command_refusal(commands_in("/new"), "901", "group", stricter, own_session=False) == REFUSED.format("new")
    assert command_refusal(commands_in("/pause"), "901", "group", stricter, own_session=False) is None
