"""Where everything lives under a home (SPEC section 2). Keys never become paths."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

RunFolder = Literal["running", "paused", "completed"]
FOLDERS: tuple[RunFolder, ...] = ("running", "paused", "completed")

MESSAGES = "messages.jsonl"
CURRENT = "current.jsonl"
SUMMARIES = "summaries.jsonl"
TOOLS = "tools.jsonl"
PLANNING = "planning.jsonl"
METADATA = "metadata.json"
FINAL_SUMMARY = "final_summary.txt"
STORE_FILES = (MESSAGES, CURRENT, SUMMARIES, TOOLS, PLANNING)
PRIVATE_DIR = 0o700  # the home and every folder in it: conversations are private to the owner
PRIVATE_FILE = 0o600
PRIVATE_UMASK = 0o077  # set by the CLI and the daemon at start, so every file is created 0600


def folder_for(status: str) -> RunFolder:
    if status == "running":
        return "running"
    if status == "paused":
        return "paused"
    return "completed"


class _Below:
    """A path of the home: ``name`` under the path ``parent`` names (``root`` or another ``_Below``)."""

    def __init__(self, parent: str, name: str) -> None:
        self.parent, self.name = parent, name

    def __get__(self, home: Home, owner: type[Home] | None = None) -> Path:
        parent: Path = getattr(home, self.parent)
        return parent / self.name


@dataclass(frozen=True)
class Home:
    root: Path

    contexts = _Below("root", "contexts")
    sessions_json = _Below("contexts", "sessions.json")
    tasks_db = _Below("contexts", "tasks.db")
    archive = _Below("contexts", "archive")
    lock_file = _Below("root", "gateway.lock")
    gateway_json = _Below("root", "gateway.json")
    logs = _Below("root", "logs")
    workspaces = _Below("root", "workspaces")

    def folder(self, name: RunFolder) -> Path:
        return self.contexts / name

    def run_dir(self, run_id: str, status: str) -> Path:
        return self.contexts / folder_for(status) / run_id

    def archive_file(self, run_id: str) -> Path:
        return self.archive / f"{run_id}.tar.gz"

    def ensure(self) -> None:
        """Create the folders, private to the owner (0700) whatever the umask."""
        self.root.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        for name in FOLDERS:
            self.folder(name).mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        self.archive.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        self.logs.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
