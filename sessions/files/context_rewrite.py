"""Carrying out a context rewrite in a run folder (blocking: the writer thread runs it).

Commit order, chosen so a crash at any point leaves the old or the new context and recovery can
roll forward: (1) the old context is saved to ``compactions/{id}.jsonl`` (``id`` the summary id, so
an archive is never overwritten, even after ``/uncompact``); (2) the summary record is appended
to summaries.jsonl and synced — this is the commit point; (3) current.jsonl is replaced
atomically. Recovery (``sessions.files.recovery``) redoes (3) when (2) happened without it.
messages.jsonl is never touched.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from home import layout
from sessions.codec import encode
from sessions.compaction import COMPACTIONS
from sessions.files.jsonl import read_records, write_records_atomic
from sessions.records import ContextRewrite
from sessions.rewrites import Compaction, ContextChange, Uncompaction, compacted, to_undo, tokens_of, uncompacted


def commit(folder: Path, change: ContextChange) -> ContextRewrite | None:
    if isinstance(change, Compaction):
        return _compact(folder, change)
    return _uncompact(folder, change)


def _compact(folder: Path, change: Compaction) -> ContextRewrite | None:
    current = read_records(folder / layout.CURRENT)
    done = compacted(change, current)
    if done is None:
        return None
    new_lines, record = done
    (folder / COMPACTIONS).mkdir(mode=0o700, exist_ok=True)
    write_records_atomic(folder / str(record["archive"]), current)
    _append_synced(folder / layout.SUMMARIES, record)
    write_records_atomic(folder / layout.CURRENT, new_lines)
    size = (folder / layout.CURRENT).stat().st_size
    return ContextRewrite(
        int(record["tokens_after"]), len(new_lines) - len(current), size, change.compaction_count,
        change.summary_id, tokens_before=int(record["tokens_before"]),
    )  # fmt: skip


def _uncompact(folder: Path, change: Uncompaction) -> ContextRewrite | None:
    found = to_undo(read_records(folder / layout.SUMMARIES))
    if found is None:
        return None
    undone, archive = found
    saved = folder / archive
    if not saved.exists():
        return None
    current = read_records(folder / layout.CURRENT)
    new_lines, record = uncompacted(change, undone, archive, read_records(saved), current)
    _append_synced(folder / layout.SUMMARIES, record)
    write_records_atomic(folder / layout.CURRENT, new_lines)
    size = (folder / layout.CURRENT).stat().st_size
    return ContextRewrite(
        tokens_of(new_lines), len(new_lines) - len(current), size, change.compaction_count - 1, change.summary_id
    )


def _append_synced(path: Path, record: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, encode(record))
        os.fsync(fd)
    finally:
        os.close(fd)
