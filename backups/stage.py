"""Staging a backup: a private copy of the home under ``<home>/backups/.staging-*`` (blocking).

The active runs are *frozen*: every file of their folders hard-linked into the stage with its
size at that moment (``freeze_runs``, run on the append writer's thread, where no append, move or
rewrite happens in between), then each link replaced by a copy of the bytes it had then
(``settle_runs``): appends after the point do not reach the stage and nothing tears. The rest
(completed runs, archives, SQLite databases through the backup API, workspaces, the memory
tables, the config) is copied as it is; files that vanish while they are copied (a run archived
meanwhile) are skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from backups.manifest import walk_files
from home.atomic import write_atomic
from home.layout import FOLDERS, MESSAGES, PRIVATE_DIR, Home
from sessions.files.registry import FORMAT_VERSION as SESSIONS_FORMAT

STAGING_PREFIX = ".staging-"
CHUNK = 1 << 20


@dataclass
class FrozenRun:
    run_id: str
    state: str
    files: dict[Path, int] = field(default_factory=dict)  # staged path -> size at the point
    seq: int = 0  # the last seq of messages.jsonl at the point


def _mkdir(path: Path) -> None:
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)


def _is_temp(name: str) -> bool:
    return name.endswith(".tmp")


def freeze_runs(stage: Home, folders: Iterable[Path]) -> list[FrozenRun]:
    """Hard-link every file of each run folder (``contexts/<state>/<uuid>``) into the stage,
    recording its size; a file system without links gets a copy instead (longer, still exact)."""
    frozen = []
    for folder in folders:
        if not folder.is_dir():
            continue
        run = FrozenRun(folder.name, folder.parent.name)
        target_root = stage.contexts / run.state / run.run_id
        for source in walk_files(folder):
            if _is_temp(source.name):
                continue
            target = target_root / source.relative_to(folder)
            _mkdir(target.parent)
            size = source.stat().st_size
            try:
                os.link(source, target)
            except OSError:
                copy_prefix(source, target, size)
            run.files[target] = size
        _mkdir(target_root)
        frozen.append(run)
    return frozen


def settle_runs(frozen: Iterable[FrozenRun]) -> None:
    """Replace each link by a copy of the bytes the file had at the point (the link itself
    stays untouched: appends and truncations of the live file do not reach the copy)."""
    for run in frozen:
        for path, size in run.files.items():
            tmp = path.with_name(path.name + ".settle")
            copy_prefix(path, tmp, size, whole_lines=path.suffix == ".jsonl")
            os.replace(tmp, path)
        messages = next((p for p in run.files if p.name == MESSAGES and p.parent.name == run.run_id), None)
        run.seq = last_seq(messages) if messages is not None else 0


def copy_prefix(source: Path, target: Path, size: int, *, whole_lines: bool = False) -> None:
    """The first ``size`` bytes of ``source`` (cut after the last newline when ``whole_lines``)."""
    with open(source, "rb") as src, open(target, "wb", opener=_private) as dst:
        left = size
        data = bytearray()
        while left > 0 and (block := src.read(min(CHUNK, left))):
            data += block
            left -= len(block)
            if len(data) >= CHUNK:
                cut = data.rfind(b"\n") + 1 if whole_lines else len(data)
                dst.write(data[:cut])
                del data[:cut]
        if whole_lines:
            del data[data.rfind(b"\n") + 1 :]
        dst.write(data)


def last_seq(path: Path) -> int:
    seq = 0
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as handle:
        for line in handle:
            with contextlib.suppress(ValueError, TypeError):
                value = json.loads(line).get("seq")
                if isinstance(value, int):
                    seq = value
    return seq


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def run_folders(home: Home, states: Iterable[str] = FOLDERS) -> list[Path]:
    found = []
    for state in states:
        with contextlib.suppress(FileNotFoundError):
            found.extend(sorted(p for p in home.folder(state).iterdir() if p.is_dir()))  # type: ignore[arg-type]
    return found


def copy_tree(source: Path, target: Path) -> int:
    """Copy the files under ``source`` (temp files left out); a file that vanishes meanwhile is
    skipped. The number of files copied."""
    return _copy_files((p for p in walk_files(source) if not _is_temp(p.name)), source, target)


def _copy_files(files: Iterable[Path], source: Path, target: Path) -> int:
    """Copy each file (under ``source``) to its place under ``target``, in order, owner-only; one
    that vanished meanwhile is skipped. The number of files copied."""
    copied = 0
    for path in files:
        dest = target / path.relative_to(source)
        _mkdir(dest.parent)
        try:
            shutil.copyfile(path, dest)
        except FileNotFoundError:
            continue
        os.chmod(dest, 0o600)
        copied += 1
    return copied


def copy_completed(home: Home, stage: Home, skip: set[str]) -> int:
    """Completed runs not frozen already; a folder removed while copied (archived) is left out."""
    copied = 0
    for folder in run_folders(home, ("completed",)):
        if folder.name in skip:
            continue
        target = stage.contexts / "completed" / folder.name
        if copy_tree(folder, target) and (folder / "metadata.json").exists():
            copied += 1
        else:
            shutil.rmtree(target, ignore_errors=True)
    return copied


def copy_archives(home: Home, stage: Home) -> int:
    _mkdir(stage.archive)
    copied = 0
    with contextlib.suppress(FileNotFoundError):
        for path in sorted(home.archive.glob("*.tar.gz")):
            with contextlib.suppress(FileNotFoundError):
                shutil.copyfile(path, stage.archive / path.name)
                os.chmod(stage.archive / path.name, 0o600)
                copied += 1
    return copied


def backup_sqlite(source: Path, target: Path) -> bool:
    """One consistent copy of a SQLite database through its backup API (a read transaction:
    writers may go on); False when there is no such database."""
    if not source.exists():
        return False
    _mkdir(target.parent)
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(fd)
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
            dst.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            dst.close()
    finally:
        src.close()
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{target}{suffix}")
    return True


def copy_lance(source: Path, target: Path) -> int:
    """The LanceDB tables: version manifests first, then the data they name (data files are
    written before the manifest that names them, so every copied version is complete)."""
    if not source.is_dir():
        return 0
    files = [p for p in walk_files(source) if not _is_temp(p.name)]
    files.sort(key=lambda p: (0 if "_versions" in p.parts else 1, str(p)))
    return _copy_files(files, source, target)


def write_sessions(stage: Home, encoded: Mapping[str, str]) -> None:
    """sessions.json from the entries as the store held them at the point (registry format)."""
    parts = [f"{json.dumps(key, ensure_ascii=False)}:{text}" for key, text in sorted(encoded.items())]
    document = f'{{"format_version":{SESSIONS_FORMAT},"sessions":{{\n' + ",\n".join(parts) + "\n}}\n"
    _mkdir(stage.contexts)
    write_atomic(stage.sessions_json, document.encode("utf-8"))


def new_stage(home: Home, name: str) -> Home:
    """A fresh stage under ``<home>/backups`` (same file system: the links of ``freeze_runs``);
    stages a crashed backup left are removed first (the caller is the only backup running)."""
    parent = home.root / "backups"
    _mkdir(parent)
    for stale in parent.glob(STAGING_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    stage = Home(parent / f"{STAGING_PREFIX}{name}")
    stage.root.mkdir(mode=PRIVATE_DIR)
    for folder in FOLDERS:
        _mkdir(stage.folder(folder))
    return stage
