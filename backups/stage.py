"""Staging a backup: a private copy of the home under ``<home>/backups/.staging-*`` (blocking).

The store stages its own part at one point (``sessions.protocol.Backup``: the files backend
freezes its active runs, PostgreSQL writes its dump as a files home); the rest (channels.db and
the Matrix crypto stores through SQLite's backup API, workspaces, the memory tables, the config)
is copied as it is (``home.copies``), files that vanish while they are copied skipped. This
module: the stage itself and the memory tables.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from home.copies import copy_files, is_temp, private_dir, walk_files
from home.layout import FOLDERS, PRIVATE_DIR, Home

STAGING_PREFIX = ".staging-"


def copy_lance(source: Path, target: Path) -> int:
    """The LanceDB tables: version manifests first, then the data they name (data files are
    written before the manifest that names them, so every copied version is complete)."""
    if not source.is_dir():
        return 0
    files = [p for p in walk_files(source) if not is_temp(p.name)]
    files.sort(key=lambda p: (0 if "_versions" in p.parts else 1, str(p)))
    return copy_files(files, source, target)


def new_stage(home: Home, name: str) -> Home:
    """A fresh stage under ``<home>/backups`` (same file system: the links of ``freeze_runs``);
    stages a crashed backup left are removed first (the caller is the only backup running)."""
    parent = home.root / "backups"
    private_dir(parent)
    for stale in parent.glob(STAGING_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    stage = Home(parent / f"{STAGING_PREFIX}{name}")
    stage.root.mkdir(mode=PRIVATE_DIR)
    for folder in FOLDERS:
        private_dir(stage.folder(folder))
    return stage
