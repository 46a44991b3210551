"""Chunking: a pure function, checked with tables and hypothesis properties."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from memory.chunking import chunk_markdown, estimate_tokens, split_blocks


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("a", 1), ("abcd" * 10, 10), ("こんにちは世界", 3), ("日本語 text", 2), ("abc", 1)],
)
def test_estimate_tokens_follows_spec_section_4(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


def test_headings_and_paragraphs_are_boundaries() -> None:
    text = "# Title\n\nIntro para.\n\n## Work\nLine one\nLine two\n\nSecond para\n\n## Home\nTea.\n"
    chunks = chunk_markdown("MEMORY.md", text)
    assert [(c.start_line, c.end_line, c.heading) for c in chunks] == [
        (1, 4, "Title"),
        (5, 8, "Title > Work"),
        (9, 10, "Title > Work"),
        (11, 12, "Title > Home"),
    ]
    assert chunks[1].text == "## Work\nLine one\nLine two\n"
    assert chunks[1].embed_text.startswith("Title > Work\n\n")


def test_fenced_code_is_one_block() -> None:
    text = "intro\n\n```\n# not a heading\n\nstill code\n```\n\nafter\n"
    chunks = chunk_markdown("memory/a.md", text)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 2), (3, 8), (9, 9)]
    assert all(c.heading == "" for c in chunks)


def test_big_paragraph_is_windowed_with_overlap() -> None:
    lines = [f"line {i} " + "word " * 15 for i in range(40)]  # ~21 tokens a line
    chunks = chunk_markdown("memory/big.md", "\n".join(lines), chunk_tokens=100, overlap_tokens=30)
    assert len(chunks) > 5
    for a, b in itertools.pairwise(chunks):
        assert b.start_line <= a.end_line  # overlapping windows
        assert b.start_line > a.start_line  # always progressing
    assert all(estimate_tokens(c.text) <= 100 for c in chunks)


def test_one_huge_line_is_cut_by_characters() -> None:
    text = "x" * 5000
    chunks = chunk_markdown("memory/x.md", text, chunk_tokens=200)
    assert len(chunks) > 1
    assert "".join(c.text for c in chunks) == text
    assert all((c.start_line, c.end_line) == (1, 1) for c in chunks)


def test_model_input_limit_is_never_exceeded() -> None:
    text = "東京の歯医者の予約は火曜日の午後三時です。" * 30  # 630 chars, ~315 estimated tokens
    chunks = chunk_markdown(
        "memory/ja.md", text, chunk_tokens=400, overlap_tokens=40, max_input_tokens=128, count_model_tokens=len
    )
    assert len(chunks) >= 5
    assert all(len(c.embed_text) <= 128 for c in chunks)


def test_blank_document_has_no_chunks() -> None:
    assert chunk_markdown("MEMORY.md", "\n\n  \n") == []
    assert chunk_markdown("MEMORY.md", "") == []


# --- properties ----------------------------------------------------------------------------------

_WORDS = ["alpha", "beta", "gamma", "delta", "tea", "budget", "東京", "予約", "会議", "x" * 30, "1234"]
_word = st.sampled_from(_WORDS)
_line = st.lists(_word, min_size=1, max_size=14).map(" ".join)
_para = st.lists(_line, min_size=1, max_size=12).map(lambda ls: "\n".join(ls))
_heading = st.tuples(st.integers(1, 3), st.lists(_word, min_size=1, max_size=3)).map(
    lambda t: "#" * t[0] + " " + " ".join(t[1])
)
_block = st.one_of(_para, _para, _heading, st.tuples(_heading, _para).map("\n".join))
_doc = st.lists(_block, min_size=1, max_size=12).map(lambda bs: "\n\n".join(bs) + "\n")
_sizes = st.sampled_from([(16, 4), (40, 10), (200, 40)])


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


@settings(max_examples=80, deadline=None)
@given(doc=_doc, sizes=_sizes)
def test_every_line_is_covered_and_sizes_are_respected(doc: str, sizes: tuple[int, int]) -> None:
    chunk_tokens, overlap = sizes
    chunks = chunk_markdown("memory/p.md", doc, chunk_tokens=chunk_tokens, overlap_tokens=overlap)
    lines = _lines(doc)
    covered = set()
    for c in chunks:
        assert 1 <= c.start_line <= c.end_line <= len(lines)
        covered.update(range(c.start_line, c.end_line + 1))
        assert estimate_tokens(c.text) <= chunk_tokens
        if c.text in "\n".join(lines[c.start_line - 1 : c.end_line]):
            continue
        pytest.fail(f"chunk text is not the text of its lines: {c}")
    assert covered == set(range(1, len(lines) + 1))


@settings(max_examples=40, deadline=None)
@given(doc=_doc, sizes=_sizes)
def test_same_text_gives_same_chunks(doc: str, sizes: tuple[int, int]) -> None:
    a = chunk_markdown("memory/p.md", doc, chunk_tokens=sizes[0], overlap_tokens=sizes[1])
    b = chunk_markdown("memory/p.md", doc, chunk_tokens=sizes[0], overlap_tokens=sizes[1])
    assert a == b


@settings(max_examples=80, deadline=None)
@given(doc=_doc, sizes=_sizes, data=st.data())
def test_an_edit_inside_a_paragraph_changes_only_its_chunks(
    doc: str, sizes: tuple[int, int], data: st.DataObject
) -> None:
    lines = _lines(doc)
    blocks = [
        b for b in split_blocks(lines) if any(lines[i] and not lines[i].startswith("#") for i in range(b.start, b.end))
    ]
    assume(blocks)
    block = data.draw(st.sampled_from(blocks))
    editable = [i for i in range(block.start, block.end) if lines[i] and not lines[i].startswith("#")]
    i = data.draw(st.sampled_from(editable))
    new_line = data.draw(_line.filter(lambda s: s != lines[i]))
    edited = [*lines[:i], new_line, *lines[i + 1 :]]
    kw = {"chunk_tokens": sizes[0], "overlap_tokens": sizes[1]}
    before = chunk_markdown("memory/p.md", "\n".join(lines) + "\n", **kw)
    after = chunk_markdown("memory/p.md", "\n".join(edited) + "\n", **kw)
    lo, hi = block.start + 1, block.end  # 1-based inclusive range of the edited paragraph
    outside_before = [c for c in before if c.end_line < lo or c.start_line > hi]
    outside_after = [c for c in after if c.end_line < lo or c.start_line > hi]
    assert outside_after == outside_before
    assert all(lo <= c.start_line and c.end_line <= hi for c in after if c not in outside_after)
