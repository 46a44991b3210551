"""Markdown (what models write) to a Matrix message: ``formatted_body`` in the HTML subset the
spec recommends (``org.matrix.custom.html``) and the Markdown itself as the plain ``body`` beside
it, split into messages under a sane size.

The HTML is Telegram's converter's (``channels/telegram_format.py``: every character escaped
before a tag is added, so it always nests), with line breaks as ``<br>`` outside ``<pre>`` (HTML
collapses them). A part is ``body`` and ``formatted_body`` joined by a NUL (neither holds one):
the outbox renders a reply again after a restart, and the same text gives the same parts.
"""

from __future__ import annotations

import re

from channels.telegram_format import split as _split
from channels.telegram_format import to_html

# body and formatted_body together, in UTF-16 units: under 3 bytes each in UTF-8, so a part stays
# well under the 65,536 bytes of one event (JSON and all), and reads as one screenful or a few.
MATRIX_LIMIT = 16_000
SEPARATOR = "\x00"
_PRE = re.compile(r"(<pre>.*?</pre>)", re.DOTALL)


def to_matrix_html(markdown: str) -> str:
    pieces = _PRE.split(to_html(markdown))
    return "".join(p if p.startswith("<pre>") else p.replace("\n", "<br>") for p in pieces)


def _part(markdown: str) -> str:
    plain = markdown.replace(SEPARATOR, "")
    return f"{plain}{SEPARATOR}{to_matrix_html(plain)}"


def split(markdown: str, limit: int = MATRIX_LIMIT) -> list[str]:
    """The reply as parts (``body`` NUL ``formatted_body``), each at most ``limit`` units together,
    cut between paragraphs wherever possible."""
    return _split(markdown.replace(SEPARATOR, ""), limit, _part)


def content(part: str) -> dict[str, str]:
    """A part as an ``m.text`` message's content."""
    plain, _, html = part.partition(SEPARATOR)
    return {"msgtype": "m.text", "body": plain, "format": "org.matrix.custom.html", "formatted_body": html}
