"""The files backend's side of ``sessions.copying``: a home read whole into a ``Snapshot``, and a
``Snapshot`` written into a new home (run folders, tasks.db, sessions.json) as the store itself
would have left them. Synchronous: the CLI runs it under the home lock, off any event loop."""

from __future__ import annotations

import json
import shutil
import sqlite3
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from home import layout
from home.atomic import write_atomic, write_json_atomic
from home.layout import Home
from sessions.compaction import COMPACTIONS
from sessions.copy_snapshot import (
    RECORD_TABLES,
    TOMBSTONE_FIELDS,
    USAGE_FIELDS,
    CopyRefused,
    Line,
    RunCopy,
    Snapshot,
    line_text,
)
from sessions.files.archive import write_archive
from sessions.files.ledger import migrate
from sessions.files.recovery import LEDGER_METADATA
from sessions.files.registry import FORMAT_VERSION
from sessions.records import RUN_COLUMNS

_LISTS = (("messages", layout.MESSAGES), ("context", layout.CURRENT), ("summaries", layout.SUMMARIES),
          ("tools", layout.TOOLS), ("plans", layout.PLANNING))  # fmt: skip


def dump(root: Path) -> Snapshot:
    """Everything the home ``root`` holds (runs whose folder is archived are listed as skipped)."""
    home = Home(root)
    snapshot = Snapshot()
    if not home.tasks_db.exists():
        snapshot.entries = _entries(home)
        return snapshot
    conn = sqlite3.connect(f"file:{home.tasks_db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in conn.execute("SELECT * FROM tasks ORDER BY created_at, uuid")]
        for table in RECORD_TABLES:
            snapshot.records[table] = [dict(r) for r in conn.execute(f"SELECT * FROM {table}")]
        tables = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "usage_daily" in tables:  # a tasks.db from before ledger migration 6 has none
            snapshot.usage = [dict(r) for r in conn.execute(f"SELECT {', '.join(USAGE_FIELDS)} FROM usage_daily")]
        if "tombstones" in tables:
            sql = f"SELECT {', '.join(TOMBSTONE_FIELDS)} FROM tombstones ORDER BY id"
            snapshot.tombstones = [dict(r) for r in conn.execute(sql)]
    finally:
        conn.close()
    for row in rows:
        row = {k: row.get(k) for k in RUN_COLUMNS}
        folder = home.run_dir(row["uuid"], row["status"])
        archive = home.archive_file(row["uuid"])
        if folder.is_dir():
            snapshot.runs.append(_run(row, folder))
        elif row.get("archived_at") and archive.is_file():
            snapshot.runs.append(_archived_run(row, archive))
        else:
            why = "archived, its tar.gz is missing" if row.get("archived_at") else "its folder is missing"
            snapshot.skipped.append(f"run {row['uuid']} of {row.get('session_key')!r}: {why}")
    snapshot.entries = _entries(home)
    return snapshot


def _run(row: dict[str, Any], folder: Path) -> RunCopy:
    run = RunCopy(row=row)
    for attr, name in _LISTS:
        setattr(run, attr, _lines(folder / name))
    final = folder / layout.FINAL_SUMMARY
    run.final_summary = final.read_text(encoding="utf-8") if final.exists() else None
    archives = folder / COMPACTIONS
    if archives.is_dir():
        for path in sorted(archives.glob("*.jsonl")):
            run.archives[f"{COMPACTIONS}/{path.name}"] = _lines(path)
    return run


def _archived_run(row: dict[str, Any], archive: Path) -> RunCopy:
    """An archived run, read from its tar.gz (unpacked into a private temporary folder)."""
    with tempfile.TemporaryDirectory(prefix="neotask-copy-") as tmp, tarfile.open(archive, mode="r:gz") as tar:
        tar.extractall(tmp, filter="data")
        return _run(row, Path(tmp) / str(row["uuid"]))


def _lines(path: Path) -> list[Line]:
    if not path.exists():
        return []
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for number, line in enumerate(lines, start=1):
        try:
            json.loads(line)
        except ValueError as exc:
            raise CopyRefused(f"{path}: line {number} is not JSON ({exc}); run `neotask doctor --fix` first") from exc
    return lines


def _entries(home: Home) -> dict[str, dict[str, Any]]:
    if not home.sessions_json.exists():
        return {}
    sessions = json.loads(home.sessions_json.read_text(encoding="utf-8")).get("sessions", {})
    return {key: {**body, "key": key} for key, body in sessions.items()}


def is_empty(root: Path) -> str | None:
    """None when ``root`` holds no sessions (missing, or no run, entry or record), else what it holds."""
    if not root.exists():
        return None
    found = dump(root)
    if not found.empty() or found.skipped:
        return f"{root} already holds {len(found.runs) + len(found.skipped)} runs and {len(found.entries)} sessions"
    return None


def load(root: Path, snapshot: Snapshot) -> None:
    """Write ``snapshot`` into the (empty) home ``root``."""
    home = Home(root)
    home.ensure()
    for run in snapshot.runs:
        folder = home.run_dir(run.run_id, str(run.row["status"]))
        folder.mkdir(mode=layout.PRIVATE_DIR, parents=True)
        write_json_atomic(folder / layout.METADATA, {k: run.row.get(k) for k in LEDGER_METADATA})
        for attr, name in _LISTS:
            _write_lines(folder / name, getattr(run, attr))
        if run.final_summary is not None:
            write_atomic(folder / layout.FINAL_SUMMARY, run.final_summary.encode("utf-8"))
        if run.archives:
            (folder / COMPACTIONS).mkdir(mode=layout.PRIVATE_DIR)
            for name, lines in run.archives.items():
                _write_lines(folder / name, lines)
        if run.row.get("archived_at"):  # as cleanup leaves an archived run: its tar.gz, no folder
            write_archive(folder, home.archive_file(run.run_id))
            shutil.rmtree(folder)
    conn = sqlite3.connect(home.tasks_db)
    try:
        migrate(conn)
        with conn:
            for run in snapshot.runs:
                row = {k: run.row.get(k) for k in RUN_COLUMNS}
                _insert(conn, "tasks", row)
            for table in RECORD_TABLES:
                for record in snapshot.records[table]:
                    _insert(conn, table, record)
            for usage in snapshot.usage:
                _insert(conn, "usage_daily", {k: usage[k] for k in USAGE_FIELDS})
            for tombstone in snapshot.tombstones:
                _insert(conn, "tombstones", {k: tombstone[k] for k in TOMBSTONE_FIELDS})
    finally:
        conn.close()
    home.tasks_db.chmod(layout.PRIVATE_FILE)
    parts = [
        f"{json.dumps(key, ensure_ascii=False)}:{line_text({k: v for k, v in body.items() if k != 'key'})}"
        for key, body in sorted(snapshot.entries.items())
    ]
    document = f'{{"format_version":{FORMAT_VERSION},"sessions":{{\n' + ",\n".join(parts) + "\n}}\n"
    write_atomic(home.sessions_json, document.encode("utf-8"))


def _write_lines(path: Path, lines: list[Line]) -> None:
    write_atomic(path, "".join(line + "\n" for line in lines).encode("utf-8"))


def _insert(conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> None:
    names = list(row)
    quoted = ", ".join(f'"{n}"' for n in names)
    conn.execute(f"INSERT INTO {table} ({quoted}) VALUES ({', '.join('?' * len(names))})", [row[n] for n in names])
