"""Start-up recovery of active runs (blocking; runs once, off the event loop).

For every run folder in running/ and paused/: cut torn tails, find the next ids, and bring the
derived current.jsonl level with messages.jsonl by seq. Works from the files alone, so it is also
what rebuilds sessions.json when that is lost.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from home import layout
from home.atomic import private
from sessions.codec import encode
from sessions.compaction import archive_of, last_seq, rolled_forward
from sessions.context_order import context_line as context_line  # re-exported: the writer's lines
from sessions.context_order import in_context as in_context
from sessions.files.integrity import cut_lines, describe, scan_lines, seq_of
from sessions.files.jsonl import iter_records, last_record, read_records, repair_tail, write_records_atomic
from sessions.records import ACTIVE_STATUSES, ActiveStatus, Counters, counters_of

log = logging.getLogger(__name__)


@dataclass
class RecoveredRun:
    run_id: str
    status: ActiveStatus
    dir: Path
    metadata: dict[str, Any]
    next_seq: int = 1
    last_message_at: str | None = None
    context_tokens: int = 0
    context_lines: int = 0
    context_bytes: int = 0
    messages_bytes: int = 0
    last_context_seq: int = 0
    next_summary_id: int = 1
    compaction_count: int = 0
    next_tool_seq: int = 1
    next_plan_id: int = 1
    torn: list[str] = field(default_factory=list)
    levelled: int = 0
    checkpoint_used: bool = False
    damage: str | None = None  # why the run cannot go on (bad lines cut, messages lost): it is failed

    @property
    def counters(self) -> Counters:
        return counters_of(self)


# tasks.db columns that hold what metadata.json holds: with a ledger row, metadata.json is not read
LEDGER_METADATA = ("session_key", "agent_id", "chat_type", "channel", "task_type", "task_identifier",
                   "repository", "user", "parent_uuid", "created_at")  # fmt: skip


@dataclass(frozen=True)
class FolderScan:
    """What a run folder holds, from the file system alone (names and store sizes)."""

    folder: Path
    status: ActiveStatus
    names: frozenset[str]
    messages_size: int
    current_size: int
    base: str = ""  # str(folder), kept: 10,000 runs are scanned at start and pathlib's joins add up


def scan_folder(folder: Path, status: ActiveStatus, base: str | None = None) -> FolderScan | None:
    base = base or str(folder)  # plain strings: pathlib's joins cost more than the reads here
    try:
        names = frozenset(os.listdir(base))
    except FileNotFoundError:
        return None
    messages = os.stat(f"{base}/{layout.MESSAGES}").st_size if layout.MESSAGES in names else 0
    current = os.stat(f"{base}/{layout.CURRENT}").st_size if layout.CURRENT in names else 0
    return FolderScan(folder, status, names, messages, current, base)


def scan_all(contexts: Path) -> list[FolderScan]:
    """Every active run folder, scanned (only system calls)."""
    scans = []
    for status in ACTIVE_STATUSES:
        base = contexts / status
        try:
            children = sorted((entry.name, entry.path) for entry in os.scandir(base) if entry.is_dir())
        except FileNotFoundError:
            continue
        for name, path in children:
            scan = scan_folder(base / name, status, path)
            if scan is not None:
                scans.append(scan)
    return scans


def recover_run(
    folder: Path,
    status: ActiveStatus,
    row: dict[str, Any] | None = None,
    checkpoint: Counters | None = None,
    scan: FolderScan | None = None,
) -> RecoveredRun | None:
    """Repair and count one active run. ``row`` (its tasks.db row) stands in for metadata.json;
    ``checkpoint`` spares reading the stores when they are exactly as they were checkpointed."""
    scan = scan or scan_folder(folder, status)
    if scan is None:
        return None
    base, names = scan.base or str(folder), scan.names
    if row is not None:
        metadata = row  # it holds every LEDGER_METADATA column
    else:
        try:
            metadata = json.loads((folder / layout.METADATA).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            log.error("run folder %s has no readable metadata.json; left for `neotask doctor`", folder)
            return None
    run = RecoveredRun(run_id=folder.name, status=status, dir=folder, metadata=metadata)

    size = scan.messages_size
    messages_as_checkpointed = checkpoint is not None and size == checkpoint.messages_bytes and size > 0
    if checkpoint is not None and messages_as_checkpointed:
        run.next_seq, run.messages_bytes = checkpoint.message_count + 1, size  # exactly as checkpointed
    elif size:
        messages = f"{base}/{layout.MESSAGES}"
        cut, last_message = repair_tail(messages)
        if cut:
            run.torn.append(layout.MESSAGES)
        run.messages_bytes = size - cut - _check_messages(run, Path(messages))
        if run.damage is not None:
            last_message = last_record(Path(messages))
        if last_message:
            run.last_message_at = last_message.get("timestamp")

    last_summary: dict[str, Any] | None = None
    if layout.SUMMARIES in names:
        cut, last_summary = repair_tail(f"{base}/{layout.SUMMARIES}")
        if cut:
            run.torn.append(layout.SUMMARIES)
        if last_summary:
            run.next_summary_id = _int(last_summary.get("id")) + 1
            run.compaction_count = _int(last_summary.get("compaction_count"))

    size = scan.current_size
    if (
        checkpoint is not None
        and size == checkpoint.context_bytes
        and checkpoint.compaction_count == run.compaction_count
        and checkpoint.last_summary_id == run.next_summary_id - 1
        and checkpoint.last_context_seq <= run.next_seq - 1
    ):
        run.context_tokens, run.context_lines = checkpoint.context_tokens, checkpoint.context_lines
        run.last_context_seq, run.context_bytes = checkpoint.last_context_seq, size
        run.checkpoint_used = True
    else:
        _count_current(run, names, last_summary)
    held = max(run.last_context_seq, _int((last_summary or {}).get("end_seq")))
    if held > run.next_seq - 1:  # messages.jsonl lost lines the derived files still hold
        where = "is missing" if run.next_seq == 1 else f"ends at seq {run.next_seq - 1}"
        _add_damage(run, f"messages.jsonl {where} but current.jsonl or summaries.jsonl hold seqs up to {held}")
        run.next_seq = held + 1  # never hand out a seq twice
    # Both stores exactly as checkpointed: they were level then (a command after the last context
    # line leaves last_context_seq below the last seq, as it does while the run is live).
    if run.last_context_seq < run.next_seq - 1 and not (messages_as_checkpointed and run.checkpoint_used):
        _bring_level(run)

    for name, attr, id_field in ((layout.TOOLS, "next_tool_seq", "seq"), (layout.PLANNING, "next_plan_id", "id")):
        if name in names:
            cut, last = repair_tail(f"{base}/{name}")
            if cut:
                run.torn.append(name)
            if last:
                setattr(run, attr, _int(last.get(id_field)) + 1)
    if run.damage is not None:
        log.error("run %s: %s; the run will be marked failed", run.run_id, run.damage)
    return run


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _add_damage(run: RecoveredRun, what: str) -> None:
    run.damage = what if run.damage is None else f"{run.damage}; {what}"


def _check_messages(run: RecoveredRun, path: Path) -> int:
    """Read messages.jsonl whole: cut lines that are not valid records into ``.torn`` (the run
    is then damaged), log seq gaps, and set the next seq; the bytes cut."""
    report = scan_lines(path, with_seq=True)
    cut = 0
    if report.bad:
        cut = cut_lines(path, {b.line for b in report.bad})
        _add_damage(run, f"{describe(layout.MESSAGES, report.bad)} cut into {layout.MESSAGES}.torn")
    if report.gaps:
        log.warning("run %s: seqs not continuous in %s", run.run_id, describe(layout.MESSAGES, report.gaps))
    run.next_seq = report.last_seq + 1
    return cut


def _count_current(run: RecoveredRun, names: frozenset[str], last_summary: dict[str, Any] | None) -> None:
    """Read current.jsonl whole: cut a torn tail, finish an interrupted compaction, count."""
    folder = run.dir
    current: list[dict[str, Any]] = []
    if layout.CURRENT in names:
        cut, _ = repair_tail(folder / layout.CURRENT)
        if cut:
            run.torn.append(layout.CURRENT)
        current = read_records(folder / layout.CURRENT)  # logs the lines it skips
    if last_summary:
        current = _finish_interrupted_compaction(folder, last_summary, current)
    for line in current:
        run.context_tokens += _int(line.get("tokens"))
        run.context_lines += 1
    run.last_context_seq = last_seq(current)
    run.context_bytes = (folder / layout.CURRENT).stat().st_size if current else 0


def _finish_interrupted_compaction(
    folder: Path, last: dict[str, Any], current: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A compaction (or uncompact) whose summary record is durable but whose current.jsonl
    rewrite did not happen: redo the rewrite (roll forward)."""
    saved = None
    if last.get("type") == "uncompact":
        path = folder / archive_of(last)
        saved = read_records(path) if path.exists() else None
    fixed = rolled_forward(last, current, saved)
    if fixed is None:
        return current
    write_records_atomic(folder / layout.CURRENT, fixed)
    log.warning("run %s: finished an interrupted %s (current.jsonl rewritten)", folder.name, last.get("type"))
    return fixed


def _bring_level(run: RecoveredRun) -> None:
    """Append to current.jsonl the in-context messages it lacks (seq above its last)."""
    missing = [
        context_line(r)
        for r in iter_records(run.dir / layout.MESSAGES)
        if (seq_of(r) or 0) > run.last_context_seq and in_context(r)
    ]
    if missing:
        data = b"".join(encode(line) for line in missing)
        with open(run.dir / layout.CURRENT, "ab", opener=private) as handle:
            handle.write(data)
        run.context_bytes += len(data)
        run.context_tokens += sum(int(line.get("tokens", 0)) for line in missing)
        run.context_lines += len(missing)
        run.levelled = len(missing)
        run.last_context_seq = max(run.last_context_seq, _int(missing[-1].get("seq")))
        log.info("run %s: brought current.jsonl level with %d message(s)", run.run_id, len(missing))


def recover_all(
    contexts: Path,
    rows: dict[str, dict[str, Any]] | None = None,
    checkpoints: dict[str, Counters] | None = None,
) -> list[RecoveredRun]:
    rows, checkpoints = rows or {}, checkpoints or {}
    runs = []
    for scan in scan_all(contexts):
        name = scan.folder.name
        try:
            run = recover_run(scan.folder, scan.status, rows.get(name), checkpoints.get(name), scan)
        except OSError as exc:  # one run's files, not the home: that run is failed, the rest start
            run = _unreadable(scan, rows.get(name), exc)
        if run is not None:
            runs.append(run)
    return runs


def _unreadable(scan: FolderScan, row: dict[str, Any] | None, exc: OSError) -> RecoveredRun | None:
    what = f"{os.path.basename(str(exc.filename or scan.folder))} cannot be read or repaired ({exc.strerror or exc})"
    metadata = row
    if metadata is None:
        try:
            metadata = json.loads((scan.folder / layout.METADATA).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            metadata = None
    if not isinstance(metadata, dict):
        log.error("run folder %s: %s, and no readable metadata.json: left for the doctor", scan.folder, what)
        return None
    run = RecoveredRun(run_id=scan.folder.name, status=scan.status, dir=scan.folder, metadata=metadata, damage=what)
    log.error("run %s: %s; the run will be marked failed", run.run_id, what)
    return run
