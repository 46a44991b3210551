"""The files backend's ``Backup`` (``sessions.protocol``): a home's runs, entries and tasks.db
staged at one point.

The active runs are *frozen*: every file of their folders hard-linked into the stage with its
size at that moment (``freeze_runs``, run on the append writer's thread, where no append, move or
rewrite happens in between), then each link replaced by a copy of the bytes it had then
(``settle_runs``): appends after the point do not reach the stage and nothing tears. tasks.db is
copied through SQLite's backup API before the point; sessions.json is written from the entries as
the store holds them at the point; completed runs and archives are copied as they are (a folder
archived meanwhile is skipped). ``FilesBackup`` is the daemon's (behind its store's appends);
``HomeBackup`` a home's with no daemon (the caller holds the home lock: nothing writes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from config.clock import Clock, iso
from home.atomic import write_atomic
from home.copies import backup_sqlite, copy_tree, is_temp, private_dir, walk_files
from home.layout import FOLDERS, MESSAGES, Home
from sessions.backup import BackupPoint, StagedHome
from sessions.files.registry import FORMAT_VERSION, SessionRegistry
from sessions.files.writer import AppendWriter
from sessions.records import RunState

CHUNK = 1 << 20
ACTIVE = ("running", "paused")


@dataclass
class FrozenRun:
    run_id: str
    state: str
    files: dict[Path, int] = field(default_factory=dict)  # staged path -> size at the point
    seq: int = 0  # the last seq of messages.jsonl at the point


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
            if is_temp(source.name):
                continue
            target = target_root / source.relative_to(folder)
            private_dir(target.parent)
            size = source.stat().st_size
            try:
                os.link(source, target)
            except OSError:
                copy_prefix(source, target, size)
            run.files[target] = size
        private_dir(target_root)
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
    private_dir(stage.archive)
    copied = 0
    with contextlib.suppress(FileNotFoundError):
        for path in sorted(home.archive.glob("*.tar.gz")):
            with contextlib.suppress(FileNotFoundError):
                shutil.copyfile(path, stage.archive / path.name)
                os.chmod(stage.archive / path.name, 0o600)
                copied += 1
    return copied


def write_sessions(stage: Home, encoded: Mapping[str, str]) -> None:
    """sessions.json from the entries as the store held them at the point (registry format)."""
    parts = [f"{json.dumps(key, ensure_ascii=False)}:{text}" for key, text in sorted(encoded.items())]
    document = f'{{"format_version":{FORMAT_VERSION},"sessions":{{\n' + ",\n".join(parts) + "\n}}\n"
    private_dir(stage.contexts)
    write_atomic(stage.sessions_json, document.encode("utf-8"))


def _point(at: str, frozen: list[FrozenRun], completed: int, archives: int) -> BackupPoint:
    runs = {run.run_id: {"state": run.state, "seq": run.seq} for run in frozen}
    return BackupPoint(at, runs, notes={"completed_runs": completed, "archives": archives})


def _copy_ended(home: Home, stage: Home, frozen: list[FrozenRun]) -> tuple[int, int]:
    """Completed runs (but the frozen ones) and archives; how many of each."""
    return copy_completed(home, stage, {run.run_id for run in frozen}), copy_archives(home, stage)


class FilesBackup:
    """The daemon's: the point is one pass of the event loop, which takes the entries and queues
    the freeze behind every append queued before it (every acknowledged message is in, each once,
    and nothing appended later is)."""

    def __init__(
        self,
        home: Home,
        registry: SessionRegistry,
        writer: AppendWriter,
        active_runs: Callable[[], Iterable[RunState]],
        clock: Clock,
    ) -> None:
        self._home = home
        self._registry = registry
        self._writer = writer
        self._active_runs = active_runs
        self._clock = clock

    async def stage_backup(self, stage: StagedHome) -> BackupPoint:
        home, target = self._home, Home(stage.root)
        await asyncio.to_thread(backup_sqlite, home.tasks_db, target.tasks_db)
        at = iso(self._clock())
        encoded = {key: entry.encode() for key, entry in self._registry.entries.items()}
        active = [run.run_id for run in self._active_runs()]

        def freeze() -> list[FrozenRun]:
            folders = [home.contexts / state / run_id for run_id in active for state in (*ACTIVE, "completed")]
            return freeze_runs(target, [f for f in folders if f.is_dir()])

        frozen = await self._writer.call(freeze)
        await asyncio.to_thread(write_sessions, target, encoded)
        await asyncio.to_thread(settle_runs, frozen)
        completed, archives = await asyncio.to_thread(_copy_ended, home, target, frozen)
        return _point(at, frozen, completed, archives)


class HomeBackup:
    """A home's with no daemon: the caller holds its lock, so the files stand still; the point is
    when the backup starts."""

    def __init__(self, root: Path, clock: Clock) -> None:
        self._home = Home(root)
        self._clock = clock

    async def stage_backup(self, stage: StagedHome) -> BackupPoint:
        return await asyncio.to_thread(self._stage, Home(stage.root))

    def _stage(self, target: Home) -> BackupPoint:
        home = self._home
        at = iso(self._clock())
        backup_sqlite(home.tasks_db, target.tasks_db)
        if home.sessions_json.is_file():
            private_dir(target.contexts)
            shutil.copyfile(home.sessions_json, target.sessions_json)
        frozen = freeze_runs(target, run_folders(home, ACTIVE))
        settle_runs(frozen)
        completed, archives = _copy_ended(home, target, frozen)
        return _point(at, frozen, completed, archives)
