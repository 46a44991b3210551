"""Markdown → chunks, as a pure function.

Boundaries follow the document's structure: a chunk never spans two paragraphs (blocks separated
by a blank line) or crosses a heading. A heading starts a block and keeps the paragraph under it,
blank lines belong to the block above them, and a fenced code block is one block however many blank lines it holds.
A block larger than ``chunk_tokens`` is cut into windows of whole lines that overlap by about
``overlap_tokens``; a single line larger than that is cut by characters.

Because each chunk lies inside one block, editing a paragraph changes only the chunks of that
paragraph (plus, for a heading, the chunks under it, whose embedded text starts with the heading);
every other chunk keeps its text and content hash, so the index re-embeds nothing else.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

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
    lines (or a character slice of one long line); ``heading`` is the breadcrumb of the headings
    above it (``"Projects > Neotask"``), empty before the first heading. ``embed_text`` is what gets
    embedded: the heading breadcrumb, then the text. ``content_hash`` covers ``embed_text`` only, so
    a chunk that merely moves keeps its hash and its cached vector.
    """

    path: str
    start_line: int
    end_line: int
    heading: str
    text: str
    content_hash: str

    @property
    def embed_text(self) -> str:
        return f"{self.heading}\n\n{self.text}" if self.heading else self.text


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


def _char_slices(text: str, fits: Callable[[str], bool]) -> list[str]:
    """Cut one over-long line into consecutive slices that each fit (by halving)."""
    if fits(text) or len(text) <= 1:
        return [text]
    mid = len(text) // 2
    return _char_slices(text[:mid], fits) + _char_slices(text[mid:], fits)


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

    Sizes use the SPEC's token estimate (:func:`estimate_tokens`). When ``max_input_tokens`` is
    given, every chunk's ``embed_text`` is also kept within it as measured by
    ``count_model_tokens`` (the embedding model's own tokenizer; the estimate when omitted), so
    the model never truncates a chunk silently. Blank-only documents give no chunks.
    """
    if chunk_tokens < 1:
        raise ValueError("chunk_tokens must be at least 1")
    overlap = max(0, min(overlap_tokens, chunk_tokens - 1))
    lines = text.split("\n")
    if lines and lines[-1] == "" and len(lines) > 1:
        lines.pop()  # a final newline does not make an extra line
    count = count_model_tokens or estimate_tokens

    def fits(heading: str, body: str) -> bool:
        if estimate_tokens(body) > chunk_tokens:
            return False
        if max_input_tokens is None:
            return True
        return count(f"{heading}\n\n{body}" if heading else body) <= max_input_tokens

    chunks: list[Chunk] = []

    def emit(heading: str, start: int, end: int, body: str) -> None:
        embed = f"{heading}\n\n{body}" if heading else body
        chunks.append(Chunk(path, start + 1, end, heading, body, _hash(embed)))

    for block in split_blocks(lines):
        block_lines = lines[block.start : block.end]
        if not any(line.strip() for line in block_lines):
            continue
        last = max(i for i, line in enumerate(block_lines) if line.strip()) + 1
        costs = [estimate_tokens(line) + 1 for line in block_lines[:last]]
        windows = _windows(costs, chunk_tokens, overlap)
        windows[-1] = (windows[-1][0], len(block_lines))  # trailing blank lines join the last window
        for a, b in windows:
            _emit_window(block, block_lines, a, b, fits, emit)
    return chunks


def _emit_window(
    block: _Block,
    block_lines: list[str],
    a: int,
    b: int,
    fits: Callable[[str, str], bool],
    emit: Callable[[str, int, int, str], None],
) -> None:
    body = "\n".join(block_lines[a:b])
    if fits(block.heading, body):
        emit(block.heading, block.start + a, block.start + b, body)
        return
    if b - a > 1:
        mid = (a + b) // 2
        _emit_window(block, block_lines, a, mid, fits, emit)
        _emit_window(block, block_lines, mid, b, fits, emit)
        return
    line_no = block.start + a
    for piece in _char_slices(body, lambda s: fits(block.heading, s)):
        emit(block.heading, line_no, line_no + 1, piece)
