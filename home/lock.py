"""One daemon per home: an exclusive ``flock`` on ``gateway.lock``, held for the process's life."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

from config.errors import Conflict
from home.damage import DamagedState, storage_damage

EXIT_LOCKED = 73  # EX_CANTCREAT: what a second daemon exits with


class HomeLocked(Conflict):
    code = "gateway_running"
    doc = "another daemon holds this home's gateway.lock (start-up only)"
    http = False


class HomeLock:
    """Held while the object lives (or until ``release``); never blocks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock; ``HomeLocked`` when another process has it, ``DamagedState`` when the
        lock file cannot be used (a directory, a read-only or full file system)."""
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except IsADirectoryError:
            todo = f"remove it (rmdir {self.path}) or run `neotask doctor --fix`, then start again"
            raise DamagedState(self.path, "is a directory, not the lock file", todo) from None
        except OSError as exc:
            raise storage_damage(self.path, exc, doing="open the lock file") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise HomeLocked(describe_holder(self.path.parent)) from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError as exc:
            os.close(fd)
            raise storage_damage(self.path, exc, doing="write the lock file") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> HomeLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def is_locked(path: Path) -> bool:
    """Whether some process holds the lock (probing takes and drops it)."""
    if not path.is_file():
        return False
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:  # unreadable: nobody can hold it either
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def read_gateway_json(home: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((home / "gateway.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def describe_holder(home: Path) -> str:
    info = read_gateway_json(home) or {}
    pid = info.get("pid")
    if pid is None:
        try:
            pid = (home / "gateway.lock").read_text(encoding="utf-8").strip() or "?"
        except OSError:
            pid = "?"
    url = info.get("url", "starting")
    return f"gateway already running (pid {pid}, url {url})"


def clear_lock_dir(lock_file: Path) -> dict[str, Any] | None:
    """Remove a directory standing where gateway.lock belongs (which stops the lock from being
    taken at all), when it is empty (blocking; before the lock is taken): a doctor's finding,
    fixed, when there was one; ``DamagedState`` when it holds files."""
    if not lock_file.is_dir() or lock_file.is_symlink():
        return None
    try:
        lock_file.rmdir()
    except OSError as exc:
        problem = f"is a directory, not the lock file, and cannot be removed ({exc.strerror})"
        raise DamagedState(lock_file, problem, "move it aside, then start again") from None
    detail = f"{lock_file} was a directory, not the lock file"
    return {"check": "lock_is_directory", "severity": "error", "detail": detail, "fix": "remove it",
            "path": "gateway.lock", "fixed": True, "fixable": True}  # fmt: skip
