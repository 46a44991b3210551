"""Memory files: discovery, safe paths, line slices, the append-only daily log."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from config.errors import BadRequest, NotFound
from memory import sources


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "memory" / "sub").mkdir(parents=True)
    (tmp_path / "MEMORY.md").write_text("# Me\n\nLikes tea.\n")
    (tmp_path / "memory" / "2026-11-29.md").write_text("- a\n- b\n- c\n")
    (tmp_path / "memory" / "sub" / "x.md").write_text("x\n")
    (tmp_path / "memory" / "notes.txt").write_text("not markdown\n")
    (tmp_path / "secret.md").write_text("outside memory\n")
    return tmp_path


def test_discover_lists_memory_md_and_memory_tree(ws: Path) -> None:
    assert [f.rel for f in sources.discover(ws)] == ["MEMORY.md", "memory/2026-11-29.md", "memory/sub/x.md"]


def test_extra_paths_join_the_sources(ws: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("extra")
    (outside / "ref.md").write_text("ref\n")
    rels = [f.rel for f in sources.discover(ws, [str(outside), "secret.md"])]
    assert "secret.md" in rels and (outside / "ref.md").as_posix() in rels


@pytest.mark.parametrize(
    "bad", ["../etc/passwd.md", "/etc/passwd", "memory/../../x.md", "secret.md", "memory/notes.txt", ""]
)
def test_paths_outside_the_memory_are_rejected(ws: Path, bad: str) -> None:
    with pytest.raises(BadRequest):
        sources.resolve(ws, bad)


def test_missing_memory_file_is_not_found(ws: Path) -> None:
    with pytest.raises(NotFound):
        sources.resolve(ws, "memory/2020-01-01.md")


def test_line_slice(ws: Path) -> None:
    text = (ws / "memory" / "2026-11-29.md").read_text()
    assert sources.line_slice(text, 2, 3) == "- b\n- c"
    assert sources.line_slice(text, None, 1) == "- a"
    assert sources.line_slice(text, 3, None) == "- c"
    with pytest.raises(BadRequest):
        sources.line_slice(text, 0, 2)
    with pytest.raises(BadRequest):
        sources.line_slice(text, "2", None)  # type: ignore[arg-type]


def test_append_daily_skips_lines_already_there(ws: Path) -> None:
    result = sources.append_daily(ws, "- b\n- d\n\n- d\n", date(2026, 11, 29))
    assert (result.path, result.appended, result.skipped) == ("memory/2026-11-29.md", 1, 2)
    assert (ws / "memory" / "2026-11-29.md").read_text() == "- a\n- b\n- c\n- d\n"


def test_append_daily_creates_the_file_and_never_touches_memory_md(ws: Path) -> None:
    before = (ws / "MEMORY.md").read_text()
    result = sources.append_daily(ws, "first fact", date(2026, 12, 1))
    assert result.appended == 1
    assert (ws / "memory" / "2026-12-01.md").read_text() == "first fact\n"
    assert (ws / "MEMORY.md").read_text() == before


def test_append_daily_adds_a_newline_to_a_file_without_one(ws: Path) -> None:
    (ws / "memory" / "2026-12-02.md").write_text("no newline")
    sources.append_daily(ws, "next", date(2026, 12, 2))
    assert (ws / "memory" / "2026-12-02.md").read_text() == "no newline\nnext\n"


def test_a_fifo_named_md_is_no_memory_file_and_is_never_read(ws: Path) -> None:
    """Reading a FIFO blocks until someone writes to it: one named ``*.md`` in the memory hung every
    read of it, the indexing run (so the index stayed stale) and the daemon's shutdown."""
    import os
    import threading

    os.mkfifo(ws / "memory" / "pipe.md")
    os.mkfifo(ws / "memory" / "sub" / "fifo-link-target")
    (ws / "memory" / "link.md").symlink_to(ws / "memory" / "sub" / "fifo-link-target")
    assert [f.rel for f in sources.discover(ws)] == ["MEMORY.md", "memory/2026-11-29.md", "memory/sub/x.md"]
    with pytest.raises(NotFound):
        sources.resolve(ws, "memory/pipe.md")
    outcome: list[BaseException | str] = []

    def read() -> None:
        try:
            outcome.append(sources.read_text(ws / "memory" / "pipe.md"))
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    assert outcome, "read_text blocked on a FIFO"
    assert isinstance(outcome[0], BadRequest) and "not a regular file" in str(outcome[0])
