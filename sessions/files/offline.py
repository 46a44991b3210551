"""A files home with no daemon on it (the caller holds its lock): the doctor over its files
(``HomeDoctor``, the offline ``neotask doctor``: no start-up recovery first, which would change
what it is meant to report) and a home a backup is staged in or restored into
(``StagedFilesHome``, ``sessions.backup.StagedHome``). ``sessions.backends`` hands them out."""

from __future__ import annotations

import asyncio
from pathlib import Path

from config.clock import Clock, iso
from config.settings import Settings
from home.damage import DamagedState
from home.layout import Home
from sessions.copy_snapshot import Snapshot
from sessions.files import bulk
from sessions.files.doctor import check_home
from sessions.files.history_doctor import check_home_index
from sessions.files.ledger import Ledger
from sessions.records import StoredRecord


async def index_findings(home: Home, *, fix: bool) -> list[StoredRecord]:
    """The history index's findings (built from the runs and archives when missing and ``fix``);
    none without a readable tasks.db (the doctor's own ledger check reports it)."""
    if not home.tasks_db.exists():
        return []
    ledger = Ledger(home.tasks_db)
    try:
        await ledger.open()
    except DamagedState:
        return []
    try:
        findings = await check_home_index(home.contexts, ledger, home, fix=fix)
    finally:
        await ledger.close()
    return [f.as_dict() for f in findings]


class HomeDoctor:
    """``Doctor`` over a home's files: the run folders, tasks.db, sessions.json, then the history
    index when ``history.enabled``."""

    def __init__(self, root: Path, settings: Settings, clock: Clock) -> None:
        self._home = Home(root)
        self._settings = settings
        self._clock = clock

    async def check(self, *, fix: bool) -> list[StoredRecord]:
        now = iso(self._clock())
        found = await asyncio.to_thread(check_home, self._home.root, fix=fix, now=now, settings=self._settings)
        findings = [f.as_dict() for f in found]
        if self._settings.history.enabled:
            findings += await index_findings(self._home, fix=fix)
        return findings


class StagedFilesHome:
    """``StagedHome``: a backup's stage, or a restore's home before it is renamed into place."""

    def __init__(self, root: Path) -> None:
        self._root = root

    @property
    def root(self) -> Path:
        return self._root

    def load(self, snapshot: Snapshot) -> None:
        bulk.load(self._root, snapshot)

    def check(self, *, fix: bool, now: str, settings: Settings) -> list[StoredRecord]:
        return [f.as_dict() for f in check_home(self._root, fix=fix, now=now, settings=settings)]

    async def build_history(self) -> list[StoredRecord]:
        home = Home(self._root)
        ledger = Ledger(home.tasks_db)
        await ledger.open()
        try:
            findings = await check_home_index(home.contexts, ledger, home, fix=True)
        finally:
            await ledger.close()
        return [f.as_dict() for f in findings]
