"""A run to export, as every backend hands it to the export writer: its ledger row and where its
messages are read from (a run folder or archive of the files backend, or a reader over another
backend's tables)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class RunSource:
    """Where the messages of one run can be read, for a rebuild."""

    run_id: str
    session_key: str
    agent_id: str | None
    folder: Path | None = None
    archive: Path | None = None


class ExportReader(Protocol):
    """Where a run's records are read from when they are not in a run folder or an archive (the
    PostgreSQL backend's tables). Blocking, like the file reads: called on the export's thread."""

    def messages(self) -> Iterator[dict[str, Any]]:
        """The run's messages in seq order, streamed."""
        ...

    def summaries(self) -> list[dict[str, Any]]: ...
    def final_summary(self) -> str | None: ...


@dataclass(frozen=True)
class RunExport:
    """A run to export: its ledger row (``sessions.records.RUN_COLUMNS``) and where its
    messages are (``sessions/files/export.py``): ``source``'s folder or archive, or ``reader``."""

    row: dict[str, Any]
    source: RunSource
    reader: ExportReader | None = None
