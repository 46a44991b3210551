"""Half-created runs: what a failed or interrupted start of a run leaves behind (start-up).

A run is created for the message that opens it (folder, an ``.opening`` marker, metadata.json,
empty messages.jsonl, tasks.db row) and that message is appended next; the marker goes once it
is durable. If the process dies in between, or a storage
error stops the start half way and the cleanup itself cannot run (a read-only disk), the folder
holds no message: nothing in it was ever acknowledged, so start-up removes it with its row.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from home import layout
from home.atomic import fsync_dir
from sessions.records import ACTIVE_STATUSES

log = logging.getLogger(__name__)
ACTIVE = ACTIVE_STATUSES
OPENING = ".opening"  # in a run folder until the message that opened the run is durable


def opening(folder: Path) -> bool:
    return os.path.exists(folder / OPENING)


def holds_no_message(folder: Path) -> bool:
    """True when the folder has no messages.jsonl or an empty one, and no other store with lines
    (summaries, tools, plans): a run that never stored anything."""
    for name in (layout.MESSAGES, layout.SUMMARIES, layout.TOOLS, layout.PLANNING):
        try:
            if os.stat(folder / name).st_size > 0:
                return False
        except FileNotFoundError:
            continue
    return True


def half_created(contexts: Path, known: set[str]) -> list[Path]:
    """Active run folders that recovery did not take in (``known`` are the ones it did) and that
    hold no message, e.g. a folder whose metadata.json was never written (blocking)."""
    found = []
    for state in ACTIVE:
        try:
            entries = list(os.scandir(contexts / state))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.is_dir() and entry.name not in known and holds_no_message(Path(entry.path)):
                found.append(Path(entry.path))
    return found


def remove(folder: Path) -> bool:
    """Remove a half-created run folder (blocking); False (logged) when the disk refuses."""
    try:
        shutil.rmtree(folder)
        fsync_dir(folder.parent)
    except OSError as exc:
        log.error("could not remove the half-created run folder %s: %s", folder, exc)
        return False
    log.warning("removed the half-created run folder %s (it held no message)", folder)
    return True
