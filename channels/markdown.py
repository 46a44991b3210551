"""What the platforms' Markdown converters share (``telegram_format.py``, ``slack_format.py``):
the block patterns (a code fence, a heading, a bullet), how a line outside code blocks is rendered
(a heading in bold, a bullet as ``•``), and the stash that keeps pieces (code spans, links) out
of the inline formatting rules and puts them back after."""

from __future__ import annotations

import re
from collections.abc import Callable

FENCE = re.compile(r"^\s*```")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")


def render_line(line: str, inline: Callable[[str], str], bold: Callable[[str], str]) -> str:
    """One line outside code blocks: a heading as ``bold`` text, a bullet (``-``, ``*``, ``+``;
    not a line opening with ``**``) as ``•``, anything else through ``inline``."""
    heading = HEADING.match(line)
    if heading:
        return bold(inline(heading.group(1)))
    bullet = BULLET.match(line)
    if bullet and not line.lstrip().startswith("**"):
        return f"{bullet.group(1)}• {inline(bullet.group(2))}"
    return inline(line)


class Stash:
    """Pieces taken out of a text while the rest is formatted: each becomes ``mark``, its number,
    ``mark`` (``mark`` a control character the text no longer holds), and ``put_back`` restores
    them all."""

    def __init__(self, mark: str) -> None:
        self.mark = mark
        self.pieces: list[str] = []

    def take(self, pattern: re.Pattern[str], text: str, render: Callable[[re.Match[str]], str]) -> str:
        """``text`` with each match of ``pattern`` stashed as ``render`` makes it."""

        def keep(match: re.Match[str]) -> str:
            self.pieces.append(render(match))
            return f"{self.mark}{len(self.pieces) - 1}{self.mark}"

        return pattern.sub(keep, text)

    def put_back(self, text: str) -> str:
        return re.sub(rf"{self.mark}(\d+){self.mark}", lambda m: self.pieces[int(m.group(1))], text)
