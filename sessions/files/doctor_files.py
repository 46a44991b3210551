"""The doctor's checks of the files themselves (every line, seqs, modes) and its reading of a home
(run folders, temp files, archives, tasks.db rows). Blocking: run on a thread.

Part of ``sessions.files.doctor`` (which re-exports these names).
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from home import layout
from home.damage import FIX_LEDGER, DamagedState, ledger_error
from home.layout import FOLDERS, Home
from home.permissions import tighten, wide_modes
from sessions.compaction import last_seq
from sessions.files import leftovers
from sessions.files.doctor_checks import ACTIVE, RESTART, Finding, RunFolder
from sessions.files.integrity import cut_lines, describe, scan_lines
from sessions.files.jsonl import read_records
from sessions.files.ledger import MIGRATIONS, check_schema, check_version

# -- the files themselves: every line, seqs, modes (blocking) ----------------------------------------


def file_findings(home: Home, folders: Iterable[RunFolder], recorded: frozenset[str] = frozenset()) -> list[Finding]:
    """Line-level checks of every run folder's stores, then the modes of the home. The damage of a
    completed run in ``recorded`` (failed with the reason in tasks.db) is known: not reported again."""
    findings: list[Finding] = []
    for folder in folders:
        if not folder.young:
            found = _line_findings(home, folder)
            if folder.state == "completed" and folder.run_id in recorded:
                found = [f for f in found if f.kind != "fail_run"]
            findings.extend(found)
    wide = wide_modes(home.root)
    if wide is not None:
        findings.append(
            Finding(
                "wide_modes",
                "warning",
                wide.describe(),
                "clear the group and other permission bits (files 0600, folders 0700)",
                kind="tighten_modes",
                path=".",
            )
        )
    return findings


def _line_findings(home: Home, folder: RunFolder) -> list[Finding]:
    base = home.folder(layout.folder_for(folder.state)) / folder.run_id
    where = f"{folder.state}/{folder.run_id}"
    findings = []
    held = 0
    for name in layout.STORE_FILES:
        report = scan_lines(base / name, with_seq=name == layout.MESSAGES)
        relative = f"contexts/{where}/{name}"
        if report.bad:
            findings.append(
                Finding(
                    "bad_line",
                    "error",
                    f"{where}/{describe(name, report.bad)}" + (": readers skip it" if report.bad[0].line else ""),
                    f"cut the line(s) into {name}.torn" if report.bad[0].line else _fail_text(folder),
                    kind="cut_lines" if report.bad[0].line else "fail_run",
                    run_id=folder.run_id,
                    status=None if report.bad[0].line else folder.state,
                    path=relative,
                    lines=tuple(b.line for b in report.bad),
                )
            )
        if report.gaps:
            torn = " (lines were cut into messages.jsonl.torn)" if (base / f"{name}.torn").exists() else ""
            detail = f"{where}/{describe(name, report.gaps)}{torn}"
            findings.append(
                Finding(
                    "seq_gap",
                    "warning",
                    detail,
                    _fail_text(folder),
                    kind="fail_run",
                    run_id=folder.run_id,
                    path=relative,
                    status=folder.state,
                )
            )
        if name == layout.MESSAGES:
            held = report.last_seq
        elif name == layout.CURRENT and report.lines and not findings:  # bad lines may have held them
            context_seq = last_seq(read_records(base / name))
            if context_seq > held:
                ends = f"ends at seq {held}" if held else "is missing or empty"
                kept = (base / f"{layout.MESSAGES}.torn").exists()  # cut there: known, and kept
                findings.append(
                    Finding(
                        "lost_messages",
                        "warning" if kept else "error",
                        f"{where}/messages.jsonl {ends} but current.jsonl holds seqs up to {context_seq}"
                        + (" (lines were cut into messages.jsonl.torn)" if kept else "")
                        + ("; the next start marks the run failed" if folder.state in ACTIVE else ""),
                        _fail_text(folder),
                        kind="fail_run",
                        run_id=folder.run_id,
                        path=f"contexts/{where}/messages.jsonl",
                        status=folder.state,
                    )
                )
    return findings


def _fail_text(folder: RunFolder) -> str:
    if folder.state in ACTIVE:
        return (
            "mark the run failed with this reason, as start-up recovery does (its folder goes to completed/,"
            " the key goes on in a new run, nothing is deleted; inside the daemon: " + RESTART + ")"
        )
    return "mark the run failed in tasks.db with this reason (nothing is deleted), so it is not reported again"


def fix_files(home: Home, finding: Finding) -> bool:
    """Cut bad lines into ``.torn`` or tighten modes; whether it was done."""
    if finding.kind == "cut_lines" and finding.path:
        cut_lines(home.root / finding.path, set(finding.lines))
        return True
    if finding.kind == "tighten_modes":
        tighten(home.root)
        return True
    return False


# -- reading a home -------------------------------------------------------------------------------


def file_clock(folder: Path) -> float:
    """Now as the file system under ``folder`` stamps files (blocking): the mtime of a file made and
    removed there. The age of a file is measured against the clock that stamped it, which need not
    be this process's: a network file system stamps with its server's clock, and a process whose
    clock is shifted (libfaketime, a container's time namespace) still gets the kernel's stamps.
    This process's clock when nothing can be written there."""
    try:
        with tempfile.TemporaryFile(dir=folder) as probe:
            return os.fstat(probe.fileno()).st_mtime
    except OSError:
        return time.time()


def scan_folders(home: Home, *, min_age_s: float = 0.0, now: float | None = None) -> tuple[RunFolder, ...]:
    """Every run folder (blocking). Active folders changed within ``min_age_s`` are marked young
    and judged only as present: a run being created has its folder before its tasks.db row. A
    resting folder (completed, failed) always had its row first, so a young one is judged too.
    Ages are measured on the file system's clock (``file_clock``) unless ``now`` is given."""
    now = (file_clock(home.contexts) if min_age_s else time.time()) if now is None else now
    found = []
    for state in FOLDERS:
        base = home.folder(state)
        try:
            children = sorted(os.scandir(base), key=lambda e: e.name)
        except FileNotFoundError:
            continue
        for child in children:
            if not child.is_dir():
                continue
            stat = child.stat()
            young = state in ACTIVE and now - stat.st_mtime < min_age_s  # runs are created only there
            metadata = _read_metadata(Path(child.path))
            empty = metadata is None and leftovers.holds_no_message(Path(child.path))
            found.append(RunFolder(child.name, state, metadata, young, empty))
    return tuple(found)


def _read_metadata(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / layout.METADATA).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def scan_tmp(home: Home, *, min_age_s: float = 0.0, now: float | None = None) -> tuple[str, ...]:
    """Temp files of atomic rewrites (``.<name>.tmp``) under the home and contexts/ (blocking),
    but those changed within ``min_age_s`` (on the file system's clock unless ``now`` is given)."""
    now = (file_clock(home.contexts) if min_age_s else time.time()) if now is None else now
    found = []
    roots = [(home.root, False), (home.contexts, True)]
    for root, recursive in roots:
        walker = os.walk(root) if recursive else [(str(root), [], _files(root))]
        for folder, _, names in walker:
            for name in names:
                if not name.endswith(".tmp"):
                    continue
                path = Path(folder) / name
                try:
                    if now - path.stat().st_mtime < min_age_s:
                        continue
                except FileNotFoundError:
                    continue
                found.append(str(path.relative_to(home.root)))
    return tuple(sorted(found))


def _files(folder: Path) -> list[str]:
    try:
        return [e.name for e in os.scandir(folder) if e.is_file()]
    except FileNotFoundError:
        return []


def scan_archives(home: Home) -> frozenset[str]:
    try:
        return frozenset(n.removesuffix(".tar.gz") for n in os.listdir(home.archive) if n.endswith(".tar.gz"))
    except FileNotFoundError:
        return frozenset()


def read_rows(db: Path) -> dict[str, dict[str, Any]]:
    """tasks.db rows by uuid (blocking; no migration, nothing written). ``DamagedState`` when the
    file is not a SQLite database, not a neotask ledger, or from a newer neotask."""
    if not db.exists():
        return {}
    try:
        conn = sqlite3.connect(db)
    except sqlite3.Error as exc:
        raise ledger_error(db, exc) from None
    try:
        conn.row_factory = sqlite3.Row
        version = check_version(conn, db)
        if version == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
            return {}  # nothing migrated yet: an empty ledger
        if version in (0, len(MIGRATIONS)):  # 0 with tables: not ours
            check_schema(conn, db)
        problems = [str(r[0]) for r in conn.execute("PRAGMA quick_check(3)")]  # every page (start-up only
        if problems != ["ok"]:  # reads the header and the schema: damage deeper down is found here)
            raise DamagedState(db, f"damaged pages ({'; '.join(problems)})", FIX_LEDGER)
        return {r["uuid"]: dict(r) for r in conn.execute("SELECT * FROM tasks")}
    except sqlite3.Error as exc:
        raise ledger_error(db, exc) from None
    finally:
        conn.close()
