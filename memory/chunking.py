"""Markdown → chunks, as a pure function.

Boundaries follow the document's structure: a chunk never spans two paragraphs (blocks separated
by a blank line) or crosses a heading, with one exception: a block of nothing but headings joins
the section right under it (``paragraph_blocks``). A heading starts a block and keeps the
paragraph under it, blank lines belong to the block above them, and a fenced code block is one
block however many blank lines it holds.
A block larger than ``chunk_tokens`` is cut into windows of whole lines that overlap by about
``overlap_tokens``; a single line larger than that is cut between sentences, then between words,
and only a single word longer than a chunk is cut inside (never the case for prose).

Context that is indexed but not shown (``Chunk.context``): in a dated file (``YYYY-MM-DD.md``) its
date; in a transcript (most paragraphs or lines start with ``Speaker:`` or ``[time] Speaker:``)
the turn before the chunk's first line, so a reply ("yes, with my sister") is found by a question
about what it answers. The heading breadcrumb (a session's date heading) was already there.

Because each chunk lies inside one block, editing a paragraph changes only the chunks of that
paragraph (plus, for a heading, the chunks under it, whose embedded text starts with the heading);
every other chunk keeps its text and content hash, so the index re-embeds nothing else.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date

_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t#]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (
        0x3040 <= o <= 0x309F
        or 0x30A0 <= o <= 0x30FF
        or 0x31F0 <= o <= 0x31FF
        or 0xFF66 <= o <= 0xFF9F
        or 0x3400 <= o <= 0x4DBF
        or 0x4E00 <= o <= 0x9FFF
    )


def estimate_tokens(text: str) -> int:
    """SPEC section 4: ``len // 4``, or ``len // 2`` when kana and CJK ideographs are at least half."""
    if not text:
        return 0
    cjk = sum(1 for ch in text if _is_cjk(ch))
    n = len(text) // 2 if cjk * 2 >= len(text) else len(text) // 4
    return max(1, n)


@dataclass(frozen=True)
class Chunk:
    """One retrievable piece of a Markdown file.

    ``start_line`` and ``end_line`` are 1-based and inclusive. ``text`` is the file's text for those
    lines (or a piece of one long line cut between sentences or words); ``heading`` is the
    breadcrumb of the headings above it (``"Projects > Neotask"``), empty before the first heading.
    ``context`` is indexed but not part of ``text``: the file's date and, in a transcript, the
    preceding turn. ``embed_text`` is what gets embedded and searched: the heading breadcrumb, the
    context, then the text. ``content_hash`` covers ``embed_text`` only, so a chunk that merely
    moves keeps its hash and its cached vector.
    """

    path: str
    start_line: int
    end_line: int
    heading: str
    text: str
    content_hash: str
    context: str = ""

    @property
    def embed_text(self) -> str:
        return _embed(self.heading, self.context, self.text)


def _embed(heading: str, context: str, body: str) -> str:
    head = "\n".join(part for part in (heading, context) if part)
    return f"{head}\n\n{body}" if head else body


@dataclass(frozen=True)
class _Block:
    start: int  # 0-based index of the first line
    end: int  # exclusive
    heading: str


def _heading_text(match: re.Match[str]) -> str:
    return (match.group(2) or "").strip()


def split_blocks(lines: list[str]) -> list[_Block]:
    """Paragraph blocks covering every line exactly once, in order."""
    blocks: list[_Block] = []
    trail: list[tuple[int, str]] = []  # (level, text) of the headings above
    start = 0
    in_fence: str | None = None
    seen_content = False  # the current block has a non-blank line

    def crumb() -> str:
        return " > ".join(text for _, text in trail if text)

    block_heading = ""
    for i, line in enumerate(lines):
        fence = _FENCE.match(line)
        if in_fence is not None:
            if fence and fence.group(1)[0] == in_fence[0] and len(fence.group(1)) >= len(in_fence):
                in_fence = None
            continue
        heading = _HEADING.match(line)
        blank = not line.strip()
        if heading or (not blank and seen_content and i > start and not lines[i - 1].strip()):
            if i > start:
                blocks.append(_Block(start, i, block_heading))
                start = i
            seen_content = False
            if heading:
                level = len(heading.group(1))
                while trail and trail[-1][0] >= level:
                    trail.pop()
                trail.append((level, _heading_text(heading)))
            block_heading = crumb()
        if fence:
            in_fence = fence.group(1)
        if not blank and not heading:
            seen_content = True
    if start < len(lines):
        blocks.append(_Block(start, len(lines), block_heading))
    return blocks


def _windows(costs: list[int], budget: int, overlap: int) -> list[tuple[int, int]]:
    """Greedy windows of whole items, each within ``budget`` (or a single item), overlapping by
    at most ``overlap`` worth of trailing items."""
    out: list[tuple[int, int]] = []
    i = 0
    n = len(costs)
    while i < n:
        j = i
        total = 0
        while j < n and (j == i or total + costs[j] <= budget):
            total += costs[j]
            j += 1
        out.append((i, j))
        if j >= n:
            break
        back = j
        carried = 0
        while back - 1 > i and carried + costs[back - 1] <= overlap and (
            carried + costs[back - 1] + costs[j] <= budget
        ):
            back -= 1
            carried += costs[back]
        i = back
    return out


_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|(?<=[。！？])")
_SPACE = re.compile(r"(?<=\s)(?=\S)")


def _pack(parts: list[str], fits: Callable[[str], bool]) -> list[str]:
    """Greedily join consecutive ``parts`` into pieces that fit; a part that does not fit alone
    is returned on its own for the caller to cut finer."""
    out: list[str] = []
    for part in parts:
        if out and fits(out[-1] + part):
            out[-1] += part
        else:
            out.append(part)
    return out


def _split_at(text: str, pattern: re.Pattern[str]) -> list[str]:
    """``text`` cut after every match of ``pattern`` (the pieces concatenate back to ``text``)."""
    cuts = [m.end() for m in pattern.finditer(text) if 0 < m.end() < len(text)]
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def cut_line(text: str, fits: Callable[[str], bool]) -> list[str]:
    """Cut one over-long line into consecutive pieces that fit and concatenate back to it:
    between sentences first, then between words; a single word longer than a piece (or CJK text
    without any sentence end) is cut by characters, in halves."""
    if fits(text) or len(text) <= 1:
        return [text]
    out: list[str] = []
    for sentence in _pack(_split_at(text, _SENTENCE_END), fits):
        if fits(sentence):
            out.append(sentence)
            continue
        for word in _pack(_split_at(sentence, _SPACE), fits):
            out += [word] if fits(word) else _halves(word, fits)
    return out


def _halves(text: str, fits: Callable[[str], bool]) -> list[str]:
    if fits(text) or len(text) <= 1:
        return [text]
    mid = len(text) // 2
    return _halves(text[:mid], fits) + _halves(text[mid:], fits)


# ``Speaker: text``, ``- Speaker: text``, ``[10:42] Speaker: text``, ``**Speaker**: text``
_TURN = re.compile(
    r"^\s{0,3}(?:[-*+]\s+)?(?:\[[^\]\n]{1,32}\]\s*)?"  # an optional list marker and [time]
    r"(?:\*\*)?[^\s:：#>`|][^:：\n]{0,39}?(?:\*\*)?[:：]\s*\S"  # the speaker, a colon, the text
)
_DATED = re.compile(r"(?:^|/)(\d{4})-(\d{2})-(\d{2})\.md$")
CONTEXT_CHARS = 300  # at most this much of the preceding turn is carried


def file_date(path: str) -> str:
    """The date of a dated file (``.../YYYY-MM-DD.md``), spelled out (``30 November 2026``), or ''."""
    m = _DATED.search(path)
    if not m:
        return ""
    try:
        return date(int(m.group(1)), int(m.group(2)), int(m.group(3))).strftime("%-d %B %Y (%A)")
    except ValueError:
        return ""


def turn_lines(lines: list[str]) -> list[int] | None:
    """Indexes of the lines that start a turn, when the document is a transcript (at least four
    turns, and turns are at least half of the paragraphs or of the non-blank lines); else None."""
    turns: list[int] = []
    content = paragraphs = 0
    in_fence = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            in_fence = not in_fence
        if in_fence or not line.strip() or _HEADING.match(line):
            continue
        content += 1
        if i == 0 or not lines[i - 1].strip() or _HEADING.match(lines[i - 1]):
            paragraphs += 1
        if _TURN.match(line):
            turns.append(i)
    if len(turns) >= 4 and (2 * len(turns) >= content or 2 * len(turns) >= paragraphs):
        return turns
    return None


def _shorten(text: str, limit: int = CONTEXT_CHARS) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > limit // 2 else limit] + " …"


def _hash(embed_text: str) -> str:
    return hashlib.sha256(embed_text.encode("utf-8")).hexdigest()[:32]


def chunk_markdown(
    path: str,
    text: str,
    *,
    chunk_tokens: int = 200,
    overlap_tokens: int = 40,
    max_input_tokens: int | None = None,
    count_model_tokens: Callable[[str], int] | None = None,
) -> list[Chunk]:
    """Cut a Markdown document into chunks (see the module docstring).

    Sizes use the SPEC's token estimate (:func:`estimate_tokens`) of the chunk's own text. When
    ``max_input_tokens`` is given, every chunk's ``embed_text`` (context included) is also kept
    within it as measured by ``count_model_tokens`` (the embedding model's own tokenizer; the
    estimate when omitted), so the model never truncates a chunk silently. Blank-only documents
    give no chunks.
    """
    if chunk_tokens < 1:
        raise ValueError("chunk_tokens must be at least 1")
    overlap = max(0, min(overlap_tokens, chunk_tokens - 1))
    lines = text.split("\n")
    if lines and lines[-1] == "" and len(lines) > 1:
        lines.pop()  # a final newline does not make an extra line
    count = count_model_tokens or estimate_tokens
    context_at = _context_finder(path, lines)

    def fits(head: str, body: str) -> bool:
        if estimate_tokens(body) > chunk_tokens:
            return False
        if max_input_tokens is None:
            return True
        return count(f"{head}\n\n{body}" if head else body) <= max_input_tokens

    chunks: list[Chunk] = []

    def emit(heading: str, start: int, end: int, body: str) -> None:
        context = context_at(start)
        chunks.append(Chunk(path, start + 1, end, heading, body, _hash(_embed(heading, context, body)), context))

    for block in paragraph_blocks(lines):
        block_lines = lines[block.start : block.end]
        if not any(line.strip() for line in block_lines):
            continue
        last = max(i for i, line in enumerate(block_lines) if line.strip()) + 1
        costs = [estimate_tokens(line) + 1 for line in block_lines[:last]]
        windows = _windows(costs, chunk_tokens, overlap)
        windows[-1] = (windows[-1][0], len(block_lines))  # trailing blank lines join the last window
        for a, b in windows:
            _emit_window(block, block_lines, a, b, fits, emit, context_at)
    return chunks


def paragraph_blocks(lines: list[str]) -> list[_Block]:
    """The blocks chunks are cut from: :func:`split_blocks`, with each block of nothing but
    headings joined to the block right under it
    (``# About the user`` right before ``## Preferences``): alone it would be a chunk of a few
    words, which a retrieval model places near any question (E5 gave a chunk ``About the user``
    0.82 with "quantum chromodynamics lattice", as much as with a question it answers)."""
    out: list[_Block] = []
    for block in split_blocks(lines):
        previous = out[-1] if out else None
        if (
            previous is not None
            and previous.heading
            and block.heading.startswith(previous.heading + " > ")
            and all(not line.strip() or _HEADING.match(line) for line in lines[previous.start : previous.end])
        ):
            out[-1] = _Block(previous.start, block.end, block.heading)
        else:
            out.append(block)
    return out


def _context_finder(path: str, lines: list[str]) -> Callable[[int], str]:
    """``context_at(i)``: the context of a chunk whose first line is ``lines[i]`` (0-based)."""
    day = file_date(path)
    turns = turn_lines(lines)
    headings = [i for i, line in enumerate(lines) if _HEADING.match(line)]

    def previous_turn(i: int) -> str:
        if not turns:
            return ""
        at = bisect.bisect_left(turns, i) - 1  # the last turn that starts before line i
        if at < 0:
            return ""
        t = turns[at]
        h = bisect.bisect_right(headings, i) - 1
        if h >= 0 and headings[h] > t:  # a heading between them: another section, no context
            return ""
        end = t + 1
        while end < i and lines[end].strip() and not _TURN.match(lines[end]):
            end += 1
        return _shorten(" ".join(lines[t:end]))

    def context_at(i: int) -> str:
        return "\n".join(part for part in (day, previous_turn(i)) if part)

    return context_at


def _emit_window(
    block: _Block,
    block_lines: list[str],
    a: int,
    b: int,
    fits: Callable[[str, str], bool],
    emit: Callable[[str, int, int, str], None],
    context_at: Callable[[int], str],
) -> None:
    body = "\n".join(block_lines[a:b])
    line_no = block.start + a
    head = "\n".join(part for part in (block.heading, context_at(line_no)) if part)
    if fits(head, body):
        emit(block.heading, line_no, block.start + b, body)
        return
    if b - a > 1:
        mid = (a + b) // 2
        _emit_window(block, block_lines, a, mid, fits, emit, context_at)
        _emit_window(block, block_lines, mid, b, fits, emit, context_at)
        return
    for piece in cut_line(body, lambda s: fits(head, s)):
        emit(block.heading, line_no, line_no + 1, piece)
