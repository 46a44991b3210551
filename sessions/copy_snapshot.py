"""The backend-neutral copy of a store that ``sessions.copying`` moves between backends: every run
with its lines as stored, the keys' entries, the record tables, the token usage per day, agent
and key, and the tombstones of purged keys; its checksums and the comparison of a copy with its
source. Imported by both backends' ``bulk`` modules (and by backups of a PostgreSQL deployment)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]
Line = str  # one JSON line as stored, byte for byte (a message, a context line, a summary, a tool call, a plan)

RECORD_TABLES = ("idempotency", "hook_deliveries", "openai_conversations", "openai_responses")
# a usage row: the day (UTC), agent and key, and their sums (``sessions.usage``)
USAGE_FIELDS = ("day", "agent_id", "session_key", "input_tokens", "output_tokens", "cache_read_tokens",
                "cache_write_tokens", "calls")  # fmt: skip
# a tombstone as both backends can hold it: the key, when, how many runs and messages (no content;
# PostgreSQL's rows also name the run ids, which tasks.db's tombstones have no column for)
TOMBSTONE_FIELDS = ("session_key", "deleted_at", "runs", "messages")


@dataclass
class RunCopy:
    row: Row  # the run's ledger columns (``sessions.records.RunRow``, ``uuid`` the run id)
    messages: list[Line] = field(default_factory=list)
    context: list[Line] = field(default_factory=list)
    summaries: list[Line] = field(default_factory=list)
    tools: list[Line] = field(default_factory=list)
    plans: list[Line] = field(default_factory=list)
    final_summary: str | None = None
    archives: dict[str, list[Line]] = field(default_factory=dict)  # compactions/{id}.jsonl -> the lines it replaced

    @property
    def run_id(self) -> str:
        return str(self.row["uuid"])

    def counts(self) -> dict[str, int]:
        return {
            "messages": len(self.messages),
            "context": len(self.context),
            "summaries": len(self.summaries),
            "tools": len(self.tools),
            "plans": len(self.plans),
            "archives": len(self.archives),
        }

    def checksum(self) -> str:
        """sha256 of the canonical JSON of everything the run holds (messages first)."""

        def parsed(lines: list[Line]) -> list[Any]:
            return [json.loads(line) for line in lines]

        body = [parsed(self.messages), parsed(self.context), parsed(self.summaries), parsed(self.tools),
                parsed(self.plans), self.final_summary, {k: parsed(v) for k, v in self.archives.items()}]  # fmt: skip
        return hashlib.sha256(canonical(body).encode("utf-8")).hexdigest()


@dataclass
class Snapshot:
    runs: list[RunCopy] = field(default_factory=list)
    entries: dict[str, Row] = field(default_factory=dict)  # key -> the entry's fields (with its key)
    records: dict[str, list[Row]] = field(default_factory=lambda: {t: [] for t in RECORD_TABLES})
    usage: list[Row] = field(default_factory=list)  # USAGE_FIELDS, one row per day, agent and key
    tombstones: list[Row] = field(default_factory=list)  # TOMBSTONE_FIELDS, one per purge
    skipped: list[str] = field(default_factory=list)  # what the source holds and the copy cannot carry

    def empty(self) -> bool:
        return not (self.runs or self.entries or any(self.records.values()) or self.usage or self.tombstones)

    def usage_checksum(self) -> str:
        return _digest(_sorted(self.usage))

    def tombstones_checksum(self) -> str:
        return _digest(_sorted(self.tombstones))

    def report(self) -> dict[str, Any]:
        return {
            "runs": [
                {"run_id": r.run_id, "status": r.row.get("status"), **r.counts(), "sha256": r.checksum()}
                for r in sorted(self.runs, key=lambda r: r.run_id)
            ],
            "entries": len(self.entries),
            "records": {t: len(rows) for t, rows in self.records.items()},
            "usage": {"rows": len(self.usage), "sha256": self.usage_checksum()},
            "tombstones": {"count": len(self.tombstones), "sha256": self.tombstones_checksum()},
            "skipped": list(self.skipped),
        }


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical(value).encode("utf-8")).hexdigest()


def canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def line_text(value: Any) -> str:
    """A value as a backend stores a JSON line (no newline)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class CopyRefused(Exception):
    """The target is not empty, or the copy did not verify: what to do in the message."""


def differences(source: Snapshot, target: Snapshot) -> list[str]:
    """What differs between the source and the copy read back (empty: the copy is faithful)."""
    problems: list[str] = []
    mine = {r.run_id: r for r in source.runs}
    theirs = {r.run_id: r for r in target.runs}
    for run_id in sorted(mine.keys() | theirs.keys()):
        a, b = mine.get(run_id), theirs.get(run_id)
        if a is None or b is None:
            problems.append(f"run {run_id}: {'missing in the copy' if b is None else 'not in the source'}")
        elif a.counts() != b.counts() or a.checksum() != b.checksum():
            problems.append(
                f"run {run_id}: source {a.counts()} {a.checksum()[:12]}, copy {b.counts()} {b.checksum()[:12]}"
            )
        elif _columns(a.row) != _columns(b.row):
            problems.append(f"run {run_id}: its ledger row differs")
    if canonical(source.entries) != canonical(target.entries):
        problems.append(f"entries: {len(source.entries)} in the source, {len(target.entries)} in the copy (or changed)")
    for table in RECORD_TABLES:
        if canonical(_sorted(source.records[table])) != canonical(_sorted(target.records[table])):
            problems.append(
                f"{table}: {len(source.records[table])} in the source, {len(target.records[table])} in the copy"
            )
    for name, mine_rows, theirs_rows, mine_sum, theirs_sum in (
        ("usage rows", source.usage, target.usage, source.usage_checksum(), target.usage_checksum()),
        ("tombstones", source.tombstones, target.tombstones, source.tombstones_checksum(),
         target.tombstones_checksum()),
    ):  # fmt: skip
        if len(mine_rows) != len(theirs_rows) or mine_sum != theirs_sum:
            problems.append(
                f"{name}: source {len(mine_rows)} {mine_sum[:12]}, copy {len(theirs_rows)} {theirs_sum[:12]}"
            )
    return problems


def _columns(row: Row) -> Row:
    return {k: v for k, v in row.items() if v is not None}


def _sorted(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=canonical)
