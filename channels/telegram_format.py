"""Markdown (what models write) to the HTML subset Telegram renders, and long replies split into
messages under Telegram's limit.

Every character of the source is HTML-escaped before any tag is added, and each tag pair is made
by one regular expression whose inner text holds no tag, so the result always nests correctly:
Telegram never refuses it as unparsable. What cannot be converted stays as literal text. Splitting
happens on the Markdown, at paragraph boundaries first (a fenced code block is one paragraph), then
at line breaks, then at spaces, and each piece is rendered on its own, so no tag spans two messages;
a code block cut in two is closed at the end of one piece and opened again, with its language, at
the start of the next (a line of code too long for a message is cut anywhere, nothing dropped).
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Callable

from channels.markdown import FENCE as _FENCE
from channels.markdown import Stash, render_line

TELEGRAM_LIMIT = 4096  # characters (UTF-16 code units) of one message's text

_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_BOLD = re.compile(r"(\*\*|__)(?=\S)([^<>\n]*?\S)\1")
_ITALIC_STAR = re.compile(r"(?<![\w*])\*(?=[^\s*])([^<>*\n]*?[^\s*])\*(?![\w*])")
_ITALIC_UNDERSCORE = re.compile(r"(?<![\w_])_(?=[^\s_])([^<>_\n]*?[^\s_])_(?![\w_])")
_STRIKE = re.compile(r"~~(?=\S)([^<>\n]*?\S)~~")
_LINK = re.compile(r"\[([^\[\]<>\n]+)\]\((https?://[^\s()<>\"]+|tg://[^\s()<>\"]+)\)")
_QUOTE = re.compile(r"^\s{0,3}&gt;\s?(.*)$")
_TAG = re.compile(r"<[^>]+>")


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _link(match: re.Match[str]) -> str:
    href = html.unescape(match.group(2)).replace("&", "&amp;").replace('"', "&quot;")
    return f'<a href="{href}">{match.group(1)}</a>'


def _inline(text: str) -> str:
    """One line (or paragraph) of Markdown outside code blocks, escaped, with inline formatting."""
    codes = Stash("\x00")
    text = codes.take(_INLINE_CODE, text.replace("\x00", ""), _code)
    out = html.escape(text, quote=False)
    out = _BOLD.sub(r"<b>\2</b>", out)
    out = _STRIKE.sub(r"<s>\1</s>", out)
    out = _ITALIC_STAR.sub(r"<i>\1</i>", out)
    out = _ITALIC_UNDERSCORE.sub(r"<i>\1</i>", out)
    out = _LINK.sub(_link, out)
    return codes.put_back(out)


def _code(match: re.Match[str]) -> str:
    return f"<code>{html.escape(match.group(1), quote=False)}</code>"


def _bold(text: str) -> str:
    return f"<b>{text}</b>"


def _line(line: str) -> str:
    return render_line(line, _inline, _bold)


def to_html(markdown: str) -> str:
    """Telegram HTML for a piece of Markdown (always well-formed, whatever the input)."""
    lines = markdown.split("\n")
    out: list[str] = []
    quote: list[str] = []
    i = 0

    def flush_quote() -> None:
        if quote:
            out.append("<blockquote>" + "\n".join(quote) + "</blockquote>")
            quote.clear()

    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            flush_quote()
            language = line.strip()[3:].strip()
            body: list[str] = []
            i += 1
            while i < len(lines) and not _FENCE.match(lines[i]):
                body.append(lines[i])
                i += 1
            i += 1  # the closing fence (or the end of the text)
            code = html.escape("\n".join(body), quote=False)
            cls = f' class="language-{html.escape(language)}"' if re.fullmatch(r"[\w+#.-]+", language) else ""
            out.append(f"<pre><code{cls}>{code}</code></pre>")
            continue
        quoted = _QUOTE.match(html.escape(line, quote=False))
        if quoted:
            quote.append(_line(html.unescape(quoted.group(1))))
        else:
            flush_quote()
            out.append(_line(line))
        i += 1
    flush_quote()
    return "\n".join(out)


def to_plain(rendered: str) -> str:
    """The text of rendered HTML without its tags (the fallback if a send is refused as unparsable)."""
    return html.unescape(_TAG.sub("", rendered))


def blocks(markdown: str) -> list[str]:
    """Paragraphs of the Markdown, a fenced code block (blank lines and all) being one."""
    out: list[str] = []
    current: list[str] = []
    in_fence = False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            in_fence = not in_fence
        if not in_fence and not line.strip() and not _FENCE.match(line):
            if current:
                out.append("\n".join(current))
                current = []
            continue
        current.append(line)
    if current:
        out.append("\n".join(current))
    return out


Render = Callable[[str], str]


def _pieces(block: str, limit: int, render: Render) -> list[str]:
    """A block too long for one message, cut at line breaks; a line too long, at spaces, then
    anywhere. A cut inside a fenced code block closes the fence and opens it again (with its
    language) in the next piece, so every piece renders on its own as the code it holds."""
    if utf16_len(render(block)) <= limit:
        return [block]
    lines = block.split("\n")
    if len(lines) == 1:
        return _cut_line(block, limit, render)
    out: list[str] = []
    current: list[str] = []  # the piece so far; opened with ``fence`` again when it continues a code block
    fence: str | None = None  # the fence line of the code block open at the end of ``current``
    bare = False  # the last line of ``current`` opened that code block: nothing is in it yet

    def fits(piece: list[str], open_fence: str | None) -> bool:
        return utf16_len(render(_closed(piece, open_fence))) <= limit

    def flush() -> None:
        """End the piece (a fence it opened last, with nothing in it yet, goes to the next piece)."""
        nonlocal current, bare
        out.append(_closed(current[:-1], None) if bare else _closed(current, fence))
        current, bare = ([fence], True) if fence is not None else ([], False)

    for line in lines:
        opens = fence is None and _FENCE.match(line) is not None
        if opens and not fits([line, "x"], line):  # a language tag that leaves no room for code: dropped
            line = "```"
        after = line if opens else None if _FENCE.match(line) else fence
        if len(current) > bare and not fits([*current, line], after):
            flush()
        if not fits([*current, line], after):  # the line alone is too long
            if fence is not None and after is not None:  # code: cut anywhere, every character kept
                cuts = _cut_anywhere(line, limit, functools.partial(_in_block, render, fence))
            else:
                cuts = _cut_line(line, limit, render)
            for cut in cuts[:-1]:
                current.append(cut)
                bare = False
                flush()
            line = cuts[-1]
        current.append(line)
        bare = opens
        fence = after
    if len(current) > bare:
        out.append(_closed(current[:-1], None) if bare else _closed(current, fence))
    return out


def _in_block(render: Render, fence: str, code: str) -> str:
    return render(f"{fence}\n{code}\n```")


def _closed(lines: list[str], fence: str | None) -> str:
    """The lines as a piece of their own: the code block left open at its end closed."""
    return "\n".join([*lines, "```"] if fence is not None else lines)


def _cut_line(line: str, limit: int, render: Render) -> list[str]:
    """A line of text too long for one message, cut at spaces, then anywhere."""
    if utf16_len(render(line)) <= limit:
        return [line]
    words = line.split(" ")
    if len(words) > 1:
        out: list[str] = []
        current = ""
        for word in words:
            candidate = word if not current else current + " " + word
            if current and utf16_len(render(candidate)) > limit:
                out.extend(_cut_line(current, limit, render))
                current = word
            else:
                current = candidate
        out.extend(_cut_line(current, limit, render) if current else [])
        if len(out) > 1:
            return out
    return _cut_anywhere(line, limit, render)


def _cut_anywhere(text: str, limit: int, render: Render) -> list[str]:
    """Cut the raw text so that each rendered piece fits (escaping grows text)."""
    out = []
    rest = text
    while rest:
        size = min(len(rest), limit)
        while size > 1 and utf16_len(render(rest[:size])) > limit:
            size = max(1, size * 3 // 4)
        out.append(rest[:size])
        rest = rest[size:]
    return out


def split(markdown: str, limit: int = TELEGRAM_LIMIT, render: Render = to_html) -> list[str]:
    """The reply as Telegram HTML messages, each at most ``limit`` UTF-16 units, cut between
    paragraphs wherever possible. An empty reply is one message saying so."""
    parts: list[str] = []
    current = ""
    for block in blocks(markdown):
        for piece in _pieces(block, limit, render):
            candidate = piece if not current else current + "\n\n" + piece
            if current and utf16_len(render(candidate)) > limit:
                parts.append(render(current))
                current = piece
            else:
                current = candidate
    if current:
        parts.append(render(current))
    return parts or ["(empty reply)"]
