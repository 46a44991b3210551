"""What a backup is made of, on every backend (``sessions.protocol.Backup``): the home it is
staged in and the point it took.

A backup is a home laid out as the files backend's (run folders, archives, tasks.db,
sessions.json), whatever the backend: a files home is copied at one point, a PostgreSQL database
is dumped in one transaction and written as one. ``StagedHome`` is that home while a backup fills
it or a restore checks it (``sessions.backends.staged_home`` gives one): the store writes its
part into it, ``backups/`` packs and checks it without knowing the layout."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sessions.copy_snapshot import Snapshot
from sessions.records import StoredRecord

if TYPE_CHECKING:
    from config.settings import Settings


@dataclass(frozen=True)
class BackupPoint:
    """The point a store's part of a backup was taken at: when (``at``, ISO), each active run
    with its state and last seq there (``runs``: ``{run_id: {"state", "seq"}}``), what the store
    copied (``notes``: counts for the manifest) and what the manifest says of the backend
    (``meta``: nothing for the files backend; ``backend`` and how to restore for PostgreSQL)."""

    at: str
    runs: Mapping[str, Mapping[str, Any]]
    notes: Mapping[str, Any] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)


class StagedHome(Protocol):
    """A home a backup is staged in (or restored into), laid out as the files backend's."""

    @property
    def root(self) -> Path: ...

    def load(self, snapshot: Snapshot) -> None:
        """A whole store's copy (``sessions.copy_snapshot``) written as the home's runs, entries
        and records (blocking; the home holds none yet)."""
        ...

    def check(self, *, fix: bool, now: str, settings: Settings) -> list[StoredRecord]:
        """The doctor over the home (with ``fix``: its safe fixes; blocking): the findings."""
        ...

    async def build_history(self) -> list[StoredRecord]:
        """The history index built from the home's runs and archives: the doctor's findings."""
        ...
