"""Damaged or unusable state on disk: the typed error start-up and the CLI stop with, and the
explanation of an ``OSError`` or ``sqlite3`` error in words an operator can act on.

A ``DamagedState`` is never an HTTP answer: it stops ``neotask gateway`` (and offline CLI
commands) with one line naming the file and what to do, and exit status ``EXIT_STATE`` (78,
``EX_CONFIG``).
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from config.errors import NeotaskError
from home.probe import probe_writable

EXIT_STATE = 78  # EX_CONFIG: the home (configuration or state on disk) must be fixed first
FIX_LEDGER = "run `neotask doctor --fix` to rebuild it from the run folders"


class DamagedState(NeotaskError):
    """A file of the home cannot be used as it is; ``path`` names it, the message says what to do."""

    status = 503
    code = "damaged_state"
    doc = "a file of the home cannot be used as it is (start-up and CLI only)"
    http = False

    def __init__(self, path: Path | str, problem: str, todo: str) -> None:
        super().__init__(f"{path}: {problem}: {todo}")
        self.path = str(path)
        self.problem = problem
        self.todo = todo


def storage_problem(path: Path | str, exc: OSError) -> str | None:
    """Why a write under ``path`` failed, when the cause is the file system rather than the file
    (no space, read-only, no permission); None otherwise."""
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on the device"
    if code == errno.EROFS:
        return "the file system is read-only"
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied (running as uid {os.getuid()})"
    return None


def filesystem_state(path: Path | str) -> str | None:
    """The file system's own reason why nothing can be written under ``path`` (read-only, full),
    from ``statvfs``; None when it looks writable."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    if stat.f_flag & os.ST_RDONLY:
        return "the file system is read-only"
    if stat.f_bavail == 0:
        return "no space left on the device"
    return None


def storage_damage(path: Path | str, exc: OSError, *, doing: str) -> DamagedState:
    """The ``DamagedState`` for an ``OSError`` met while ``doing`` something to ``path``."""
    problem = storage_problem(path, exc) or exc.strerror or str(exc)
    return DamagedState(path, f"cannot {doing} ({problem})", _storage_todo(problem))


def _storage_todo(problem: str) -> str:
    if "space" in problem:
        return "free some space, then start again"
    if "read-only" in problem:
        return "remount it read-write or choose another --home, then start again"
    if "permission" in problem:
        return "give this user write access to the home (or run as its owner), then start again"
    return "fix the file or move it aside, then start again"


def ledger_error(path: Path, exc: sqlite3.Error) -> DamagedState:
    """The ``DamagedState`` for a SQLite error met opening tasks.db."""
    text = str(exc)
    state = filesystem_state(path.parent)
    if state is not None:  # "disk I/O error", "database or disk is full", "readonly database"
        return DamagedState(path, f"cannot open tasks.db ({state}; sqlite: {text})", _storage_todo(state))
    if not isinstance(exc, sqlite3.OperationalError) or "malformed" in text or "not a database" in text:
        return DamagedState(path, f"not a readable SQLite database ({text})", FIX_LEDGER)
    if "locked" in text or "busy" in text:  # a healthy file another process holds: never rebuilt
        return DamagedState(path, f"is locked by another process ({text})", "stop that process, then start again")
    if "unable to open" in text or "readonly" in text:
        return DamagedState(path, f"cannot open tasks.db ({text})", _storage_todo("permission"))
    if any(word in text for word in ("no such table", "no such column", "already exists")):
        return DamagedState(path, f"not a neotask ledger ({text})", FIX_LEDGER)
    return DamagedState(path, f"cannot be used ({text})", "fix it or move it aside, then start again")


def check_writable(root: Path) -> None:
    """``DamagedState`` unless a small file can be written and synced in ``root`` (blocking).
    Run at start-up, before logs or tasks.db are opened, so a read-only or full home stops the
    daemon with one line instead of a traceback from whichever file came first."""
    state = filesystem_state(root)
    if state is not None:
        raise DamagedState(root, f"cannot write the home ({state})", _storage_todo(state))
    reason = probe_writable(root)
    if reason is not None:
        problem = f"cannot write the home ({reason})"
        raise DamagedState(root, problem, _storage_todo(reason.lower()))
