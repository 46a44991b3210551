"""Line-level integrity of a run's JSON Lines stores: every complete line parses as an object,
and messages.jsonl's seqs are integers that go 1, 2, 3, ... without a gap (blocking reads).

Used by start-up recovery (an active run whose files changed since the last checkpoint) and by the
doctor (every run folder). ``cut_lines`` moves bad lines into ``<file>.torn``, as a torn tail is.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from home.atomic import private, write_atomic
from sessions.codec import decode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BadLine:
    line: int  # 1-based
    reason: str


@dataclass(frozen=True)
class LineReport:
    """What a scan of one file found. ``bad`` lines cannot be read at all; ``gaps`` are readable
    lines whose seq does not follow the previous one; ``last_seq`` is the highest good seq."""

    bad: tuple[BadLine, ...] = ()
    gaps: tuple[BadLine, ...] = ()
    last_seq: int = 0
    lines: int = 0
    torn_tail: bool = False  # the last line has no newline (a crash artefact, not corruption)


def seq_of(record: Any) -> int | None:
    """A record's seq when it is a positive integer (``True`` is not), else None."""
    seq = record.get("seq") if isinstance(record, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq > 0 else None


def _reason(raw: bytes, *, with_seq: bool) -> tuple[str | None, int | None]:
    try:
        record = decode(raw)
    except ValueError:
        return "not JSON", None
    if not isinstance(record, dict):
        return "not a JSON object", None
    if not with_seq:
        return None, None
    seq = seq_of(record)
    if seq is None:
        shown = json.dumps(record.get("seq"), ensure_ascii=False)[:40]
        return f"seq is not a positive integer ({shown})", None
    return None, seq


def scan_lines(path: Path, *, with_seq: bool) -> LineReport:
    """Check every line of ``path`` (missing: an empty report). With ``with_seq`` (messages.jsonl)
    each line needs an integer seq one above the previous good one, starting at 1."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return LineReport()
    except OSError as exc:  # a directory in its place, no permission: line 0 stands for the file
        return LineReport(bad=(BadLine(0, f"cannot be read: {exc.strerror or exc}"),))
    end = data.rfind(b"\n") + 1
    torn = end < len(data)
    lines = data[:end].split(b"\n")[:-1]
    records = _parse_all(lines)
    bad: list[BadLine] = []
    gaps: list[BadLine] = []
    last = 0
    for number, raw in enumerate(lines, start=1):
        if records is not None:  # every line parsed at once: only the shape is left to check
            record = records[number - 1]
            reason = None if isinstance(record, dict) else "not a JSON object"
            seq = seq_of(record) if reason is None and with_seq else None
            if reason is None and with_seq and seq is None:
                reason, seq = _reason(raw, with_seq=True)
        elif not raw.strip():
            reason, seq = "blank line", None
        else:
            reason, seq = _reason(raw, with_seq=with_seq)
        if reason is not None:
            bad.append(BadLine(number, reason))
        elif seq is not None:
            if seq != last + 1:
                gaps.append(BadLine(number, f"seq {seq} follows {last or 'the start'}"))
            last = max(last, seq)
    return LineReport(tuple(bad), tuple(gaps), last, len(lines), torn)


def _parse_all(lines: list[bytes]) -> list[Any] | None:
    """Every line parsed in one call (a JSON array of them: lines never hold a raw newline), or
    None when some line is not JSON on its own (then each is parsed alone, to name it)."""
    if not lines:
        return []
    try:
        parsed = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        return None
    return parsed if isinstance(parsed, list) and len(parsed) == len(lines) else None


def cut_lines(path: Path, numbers: set[int]) -> int:
    """Move the given complete lines of ``path`` into ``<file>.torn`` (appended, synced) and rewrite
    ``path`` without them atomically; the bytes cut. Run only where nothing else writes the file
    (start-up recovery, the offline doctor)."""
    if not numbers:
        return 0
    kept: list[bytes] = []
    cut: list[bytes] = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            (cut if number in numbers and raw.endswith(b"\n") else kept).append(raw)
    if not cut:
        return 0
    with open(f"{path}.torn", "ab", opener=private) as out:
        out.write(b"".join(cut))
        out.flush()
        os.fsync(out.fileno())
    write_atomic(path, b"".join(kept))
    size = sum(len(raw) for raw in cut)
    log.warning("cut %d bad line(s) (%d bytes) from %s into %s.torn", len(cut), size, path, path.name)
    return size


def describe(name: str, bad: tuple[BadLine, ...]) -> str:
    """``messages.jsonl line 2 (seq is not ...)``, the first few of them."""
    shown = ", ".join(f"line {b.line} ({b.reason})" if b.line else b.reason for b in bad[:3])
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return f"{name} {shown}{more}"
