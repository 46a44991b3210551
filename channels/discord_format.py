"""Replies for Discord: Markdown as models write it (Discord renders it: bold, italics, code spans
and blocks, lists, headings, links), split into messages of at most 2,000 characters (Discord's
limit), cut between paragraphs wherever possible and never inside a code block without closing it
and opening it again in the next message (the splitter Telegram's and Slack's replies use)."""

from __future__ import annotations

from channels.telegram_format import split as _split

DISCORD_LIMIT = 2000  # characters of one message's content (counted in UTF-16 units: never more than Discord's)


def _as_is(markdown: str) -> str:
    return markdown


def split(markdown: str, limit: int = DISCORD_LIMIT) -> list[str]:
    """The reply as Discord messages under ``limit``."""
    return _split(markdown, limit, _as_is)
