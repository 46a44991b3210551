"""Markdown (what models write) to Slack's mrkdwn, split into messages under Slack's limit.

``&``, ``<`` and ``>`` are escaped (Slack's only three); ``**bold**`` becomes ``*bold*``,
``*italic*`` and ``_italic_`` become ``_italic_``, ``~~strike~~`` ``~strike~``, links
``<url|text>``, headings bold; code spans and blocks are kept as they are (escaped).
"""

from __future__ import annotations

import re

from channels.telegram_format import split as _split

SLACK_LIMIT = 4000  # characters of one message's text (Slack truncates past 40,000; 4,000 reads well)

_FENCE = re.compile(r"^\s*```")
_CODE = re.compile(r"`[^`\n]+`")
_BOLD = re.compile(r"(\*\*|__)(?=\S)(.*?\S)\1")
_ITALIC = re.compile(r"(?<![\w*])\*(?=[^\s*])([^*\n]*?[^\s*])\*(?![\w*])")
_STRIKE = re.compile(r"~~(?=\S)(.*?\S)~~")
_LINK = re.compile(r"\[([^\[\]\n]+)\]\((https?://[^\s()<>]+)\)")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _inline(text: str) -> str:
    codes: list[str] = []

    def keep(match: re.Match[str]) -> str:
        codes.append(escape(match.group(0)))
        return f"\x00{len(codes) - 1}\x00"

    text = _CODE.sub(keep, text.replace("\x00", ""))
    links: list[str] = []

    def link(match: re.Match[str]) -> str:
        links.append(f"<{match.group(2)}|{escape(match.group(1)).replace('|', '¦')}>")
        return f"\x01{len(links) - 1}\x01"

    text = _LINK.sub(link, text)
    out = escape(text)
    out = _ITALIC.sub(r"_\1_", out)
    out = _BOLD.sub(r"*\2*", out)
    out = _STRIKE.sub(r"~\1~", out)
    out = re.sub(r"\x01(\d+)\x01", lambda m: links[int(m.group(1))], out)
    return re.sub(r"\x00(\d+)\x00", lambda m: codes[int(m.group(1))], out)


def to_mrkdwn(markdown: str) -> str:
    out: list[str] = []
    in_fence = False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
            out.append("```")
            continue
        if in_fence:
            out.append(escape(line))
            continue
        heading = _HEADING.match(line)
        bullet = _BULLET.match(line)
        if heading:
            out.append(f"*{_inline(heading.group(1))}*")
        elif bullet and not line.lstrip().startswith("**"):
            out.append(f"{bullet.group(1)}• {_inline(bullet.group(2))}")
        else:
            out.append(_inline(line))
    if in_fence:
        out.append("```")
    return "\n".join(out)


def split(markdown: str, limit: int = SLACK_LIMIT) -> list[str]:
    """The reply as mrkdwn messages under ``limit``, cut between paragraphs wherever possible."""
    return _split(markdown, limit, to_mrkdwn)
