"""``dm_policy`` for every connector (``channels/access.py``) on a real ``channels.db``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from channels.access import DirectAccess
from channels.protocol import Inbound, Target
from channels.store import ChannelStore
from config.channels import SlackAccount, TelegramAccount
from tests.conftest import FakeClock


def message(sender: str, name: str | None = None) -> Inbound:
    return Inbound("slack", "work", "main", "direct", f"D{sender}", sender, "hi", f"Ev{sender}", Target(f"D{sender}"),
                   sender_name=name)  # fmt: skip


class Notices:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    async def __call__(self, target: Target, text: str) -> None:
        self.sent.append((target.chat_id, text))


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
    assert not await access.admitted(message("U1"))  # the same code again
    assert notices.sent[1][1] == notice
    pairing = await store.approve(code.lower(), "2026-12-01T10:00:00+00:00")
    assert pairing is not None and pairing.sender_id == "U1"
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
