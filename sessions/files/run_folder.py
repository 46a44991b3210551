"""An active run of the files backend: the state every backend keeps (``sessions.records.RunState``,
which carries no path) and the folder its files are in (``contexts/running/<uuid>`` or
``contexts/paused/<uuid>``, moved as the run pauses, resumes and ends)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sessions.records import RunState


@dataclass
class FolderRun(RunState):
    dir: Path = field(kw_only=True)


def folder_run(run: RunState) -> FolderRun:
    """``run`` as the files backend holds it (every run it hands out is one)."""
    if not isinstance(run, FolderRun):
        raise TypeError(f"run {run.run_id} is not a run of the files backend")
    return run


def folder_of(run: RunState) -> Path:
    """The run's folder."""
    return folder_run(run).dir
