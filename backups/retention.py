"""Where scheduled and default backups go (``<home>/backups``), their names, and retention
(``backup.keep``: the newest N kept)."""

from __future__ import annotations

import contextlib
import re
from datetime import datetime
from pathlib import Path
from typing import Any

NAME = re.compile(r"^neotask-(\d{8}T\d{6}Z)(?:-(\d+))?\.tar\.gz$")


def _age_order(name: str) -> tuple[str, int]:
    """A backup name's place in time: its second, then its suffix as a number (``-10`` after ``-9``)."""
    found = NAME.match(name)
    assert found is not None
    return found.group(1), int(found.group(2) or 0)


def backup_dir(home: Path) -> Path:
    return home / "backups"


def default_name(now: datetime) -> str:
    return f"neotask-{now.strftime('%Y%m%dT%H%M%SZ')}.tar.gz"


def default_path(home: Path, now: datetime) -> Path:
    """A new file in the backup folder (a second backup within the same second gets a suffix)."""
    folder = backup_dir(home)
    path = folder / default_name(now)
    n = 1
    while path.exists():
        path = folder / default_name(now).replace(".tar.gz", f"-{n}.tar.gz")
        n += 1
    return path


def list_backups(home: Path) -> list[dict[str, Any]]:
    """The backups of the backup folder, newest first."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for path in backup_dir(home).iterdir():
            if NAME.match(path.name) and path.is_file():
                stat = path.stat()
                found.append({"name": path.name, "path": str(path), "size": stat.st_size})
    return sorted(found, key=lambda b: _age_order(b["name"]), reverse=True)


def prune(home: Path, keep: int, *, spare: str | None = None) -> list[str]:
    """Delete all but the newest ``keep`` backups of the backup folder; the names deleted.
    ``spare``: the backup just written, never deleted (a clock set back makes it look old)."""
    if keep <= 0:
        return []
    gone = []
    for old in list_backups(home)[keep:]:
        if old["name"] == spare:
            continue
        with contextlib.suppress(FileNotFoundError):
            Path(old["path"]).unlink()
            gone.append(old["name"])
    return gone
