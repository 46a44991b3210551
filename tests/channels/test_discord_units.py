"""Discord without a network: ``channels.discord.accounts`` through ``neotask config check``
(in-process), the message decisions (channels/discord_events.py) and the 2,000-character split
(channels/discord_format.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from channels.discord_events import Seen, Skip, inbound
from channels.discord_format import DISCORD_LIMIT, split
from config.channels import DiscordAccount
from tests.gateway.helpers import Cli

pytestmark = pytest.mark.realtime  # the CLI in-process reads the real clock
BOT = "900000000000000001"
ISSUE_EXAMPLE = """
channels:
  discord:
    accounts:
      main: {token_env: DISCORD_TOKEN, api_base: null, agent: main, dm_policy: allowlist,
             allow_from: ["123456789012345678"], require_mention: true, guilds: []}
"""


async def check(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str) -> tuple[int, str, str]:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return await Cli(capsys, tmp_path / "home")("config", "check", "--config", str(path))


async def test_the_issue_example_passes_and_an_unset_token_is_a_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DISCORD_TOKEN", raising=False)
    code, out, err = await check(capsys, tmp_path, ISSUE_EXAMPLE)
    assert code == 0, err
    assert "channels.discord.accounts.main: DISCORD_TOKEN is not set; this account will not start" in out
    monkeypatch.setenv("DISCORD_TOKEN", "MTE.x.y")
    code, out, _ = await check(capsys, tmp_path, ISSUE_EXAMPLE)
    assert code == 0 and out.startswith("OK") and "warning" not in out


@pytest.mark.parametrize(
    ("account", "named"),
    [
        ({"dm_polcy": "open"}, "channels.discord.accounts.main.dm_polcy"),
        ({"dm_policy": "everyone"}, "channels.discord.accounts.main.dm_policy"),
        ({"api_base": "discord.com/api/v10"}, "is not an http:// or https:// URL with a host"),
        ({"allow_from": ["@ann"]}, "not a Discord id"),
        ({"guilds": ["my server"]}, "not a Discord id"),
        ({"token_env": "MTE.real-token.pasted"}, "not an environment variable name"),
        ({"agent": "nobody"}, "channels.discord.accounts.main.agent 'nobody' is not a configured agent"),
    ],
)
async def test_a_bad_account_key_or_value_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, account: dict[str, Any], named: str
) -> None:
    text = yaml.safe_dump({"channels": {"discord": {"accounts": {"main": account}}}})
    code, _, err = await check(capsys, tmp_path, text)
    assert code != 0 and named in err, err
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").iterdir())


def seen(text: str, **more: Any) -> Seen:
    fields: dict[str, Any] = {"message_id": "700", "channel_id": "50", "guild_id": "10", "author_id": "300",
                              "author_name": "Ann", "author_bot": False, "text": text, **more}  # fmt: skip
    return Seen(**fields)


def test_where_a_message_goes_and_whether_it_is_answered() -> None:
    account = DiscordAccount(allow_from=("300",), guilds=("10",))
    direct = inbound(seen("hi", guild_id=None), "main", account, BOT)
    assert not isinstance(direct, Skip)
    assert (direct.chat_type, direct.chat_id, direct.thread_id, direct.reply) == ("direct", "50", None, True)
    assert direct.client_message_id == "discord:main:700" and direct.target.reply_to is None

    mentioned = inbound(seen(f"<@{BOT}> hi", mentions=(BOT,)), "main", account, BOT)
    assert not isinstance(mentioned, Skip) and mentioned.reply and mentioned.chat_type == "channel"
    assert (mentioned.chat_id, mentioned.target.chat_id, mentioned.target.reply_to) == ("50", "50", "700")
    threaded = inbound(seen(f"<@!{BOT}> in a thread", channel_id="60", parent_id="50"), "main", account, BOT)
    assert not isinstance(threaded, Skip) and threaded.reply
    assert (threaded.chat_id, threaded.thread_id, threaded.target.chat_id) == ("50", "60", "60")
    command = inbound(seen(f"<@{BOT}> /status", mentions=(BOT,)), "main", account, BOT)
    assert not isinstance(command, Skip) and command.text == "/status"
    bare_command = inbound(seen("/new"), "main", account, BOT)
    assert not isinstance(bare_command, Skip) and bare_command.reply

    for message, reason in [
        (seen("chatting"), "does not mention"),
        (seen(f"<@{BOT}> hi", guild_id="11", mentions=(BOT,)), "not one of guilds"),
        (seen("hi", author_bot=True), "a bot's message"),
        (seen("hi", author_id=BOT), "a bot's message"),
        (seen("", guild_id=None), "message content intent"),
        (seen("pinned", system=True), "a system message"),
    ]:
        skipped = inbound(message, "main", account, BOT)
        assert isinstance(skipped, Skip) and reason in skipped.reason, (message, skipped)

    edit = inbound(seen("now at 6", edited_at="2026-12-04T09:00:00+00:00", revision="edit"), "main", account, BOT)
    assert not isinstance(edit, Skip) and edit.revision == "edit" and not edit.reply
    assert edit.update_id == "700:edit:2026-12-04T09:00:00+00:00" and edit.content == "[edited message 700] now at 6"
    preview = inbound(seen("hi", guild_id=None, revision="edit"), "main", account, BOT)
    assert isinstance(preview, Skip) and "not an edit" in preview.reason
    gone = inbound(seen("", guild_id=None, revision="delete"), "main", account, BOT)
    assert not isinstance(gone, Skip) and gone.update_id == "700:delete" and not gone.reply

    keep = DiscordAccount(store_unmentioned=True)
    stored = inbound(seen("chatting"), "main", keep, BOT)
    assert not isinstance(stored, Skip) and not stored.reply
    anywhere = inbound(seen("hi", guild_id="11"), "main", DiscordAccount(require_mention=False), BOT)
    assert not isinstance(anywhere, Skip) and anywhere.reply
    files = inbound(seen("see", guild_id=None, attachments=(("a.pdf", "application/pdf"),)), "main", keep, BOT)
    assert not isinstance(files, Skip) and files.text == "see\n[file a.pdf (application/pdf)]"


def test_replies_are_split_at_2000_characters_on_paragraphs_and_code_blocks() -> None:
    paragraphs = "\n\n".join(f"paragraph {i} " + " ".join(["word"] * 80) for i in range(12))
    parts = split(paragraphs)
    assert len(parts) > 1 and all(len(p) <= DISCORD_LIMIT for p in parts)
    assert all(p.startswith("paragraph ") and p.endswith("word") for p in parts)  # cut between paragraphs
    assert "\n\n".join(parts) == paragraphs

    code = "```python\n" + "\n".join(f"x_{i} = {i}" for i in range(400)) + "\n```"
    parts = split("intro\n\n" + code)
    assert len(parts) > 2 and all(len(p) <= DISCORD_LIMIT for p in parts)
    assert all(p.count("```") % 2 == 0 for p in parts)  # each part's code block closed, the next one reopened
    assert parts[1].startswith("```python\n") and parts[2].startswith("```python\n")
    assert split("**bold** and `code`") == ["**bold** and `code`"]  # Discord reads Markdown as it is
