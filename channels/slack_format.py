"""Markdown (what models write) to Slack's mrkdwn, split into messages under Slack's limit.

``&``, ``<`` and ``>`` are escaped (Slack's only three); ``**bold**`` becomes ``*bold*``,
``*italic*`` and ``_italic_`` become ``_italic_``, ``~~strike~~`` ``~strike~``, links
``<url|text>``, headings bold; code spans and blocks are kept as they are (escaped).
"""

from __future__ import annotations

import re

from channels.markdown import FENCE, Stash, render_line
from channels.telegram_format import split as _split

SLACK_LIMIT = 4000  # characters of one message's text (Slack truncates past 40,000; 4,000 reads well)

_CODE = re.compile(r"`[^`\n]+`")
_BOLD = re.compile(r"(\*\*|__)(?=\S)(.*?\S)\1")
_ITALIC = re.compile(r"(?<![\w*])\*(?=[^\s*])([^*\n]*?[^\s*])\*(?![\w*])")
_STRIKE = re.compile(r"~~(?=\S)(.*?\S)~~")
_LINK = re.compile(r"\[([^\[\]\n]+)\]\((https?://[^\s()<>]+)\)")


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _link(match: re.Match[str]) -> str:
    return f"<{match.group(2)}|{escape(match.group(1)).replace('|', '¦')}>"


def _inline(text: str) -> str:
    codes, links = Stash("\x00"), Stash("\x01")
    text = codes.take(_CODE, text.replace("\x00", ""), lambda m: escape(m.group(0)))
    out = escape(links.take(_LINK, text, _link))
    out = _ITALIC.sub(r"_\1_", out)
    out = _BOLD.sub(r"*\2*", out)
    out = _STRIKE.sub(r"~\1~", out)
    return codes.put_back(links.put_back(out))


def _bold(text: str) -> str:
    return f"*{text}*"


def to_mrkdwn(markdown: str) -> str:
    out: list[str] = []
    in_fence = False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
            out.append("```")
        else:
            out.append(escape(line) if in_fence else render_line(line, _inline, _bold))
    if in_fence:
        out.append("```")
    return "\n".join(out)


def split(markdown: str, limit: int = SLACK_LIMIT) -> list[str]:
    """The reply as mrkdwn messages under ``limit``, cut between paragraphs wherever possible."""
    return _split(markdown, limit, to_mrkdwn)
