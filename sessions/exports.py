"""A run to export, as every backend hands it to the export writer (``sessions.export_lines``):
its ledger row and a reader of its records. Each backend brings its own reader (the files
backend's reads the run folder or its archive, PostgreSQL's pages through its tables); nothing
of where the records are kept crosses the port."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol


class ExportReader(Protocol):
    """Where a run's records are read from. Blocking: called on the export's thread."""

    def messages(self) -> Iterator[dict[str, Any]]:
        """The run's messages in seq order, streamed."""
        ...

    def summaries(self) -> list[dict[str, Any]]: ...
    def final_summary(self) -> str | None: ...


@dataclass(frozen=True)
class RunExport:
    """A run to export: its ledger row (``sessions.records.RUN_COLUMNS``) and its records' reader."""

    row: dict[str, Any]
    reader: ExportReader
