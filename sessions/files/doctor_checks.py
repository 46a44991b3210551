"""The doctor's findings and its pure checks: a ``Snapshot`` of a home in, ``Finding``s out.

Part of ``sessions.files.doctor`` (which re-exports these names); see its docstring for the steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from home.layout import folder_for
from sessions.records import ACTIVE_STATUSES

Severity = Literal["error", "warning", "info"]
FixKind = Literal[
    "insert_row", "settle_row", "set_row_status", "idle_entry", "point_entry", "remove_tmp", "rebuild_ledger",
    "cut_lines", "tighten_modes", "remove_folder", "restore_metadata", "set_aside", "fail_run", "rebuild_sessions",
]  # fmt: skip
FOLDER_FIXES = ("remove_folder", "restore_metadata", "set_aside")
SET_ASIDE = "quarantine"  # contexts/quarantine/<state>-<uuid>: folders the doctor moved out of the way
ACTIVE = ACTIVE_STATUSES
LOST = "run folder missing"  # error_message of a run settled without its folder (as recovery writes it)
DAMAGED = "damaged"  # error_message prefix of a run failed for damaged files (start-up or the doctor)
RESTART = "restart the gateway (start-up recovery adopts the run), or stop it and run `neotask doctor --fix`"
ONLINE_MIN_AGE_S = 60.0  # inside the daemon, younger files may belong to a write in progress


@dataclass(frozen=True)
class RunFolder:
    run_id: str
    state: str  # running | paused | completed
    metadata: dict[str, Any] | None  # None when metadata.json is missing or unreadable
    young: bool = False  # changed within the last moments: may be a lifecycle change in progress
    empty: bool = False  # holds no message (only judged when metadata is None)


@dataclass(frozen=True)
class Snapshot:
    folders: tuple[RunFolder, ...]
    rows: Mapping[str, Mapping[str, Any]]  # uuid -> tasks.db row (status, session_key, ...)
    entries: Mapping[str, str | None]  # key -> run_id
    tmp_files: tuple[str, ...] = ()  # relative to the home
    archives: frozenset[str] = frozenset()  # run ids with an archive file
    live: frozenset[str] | None = None  # inside the daemon: the runs its store holds as active


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    detail: str
    fix: str | None  # what --fix does; None when it needs a person
    kind: FixKind | None = None
    run_id: str | None = None
    key: str | None = None
    path: str | None = None
    status: str | None = None  # the status a row or entry is set to
    fixed: bool = False
    lines: tuple[int, ...] = ()  # the bad lines of ``path`` (cut_lines)
    manual: bool = False  # ``fix`` is for a person (upgrade) or a restart: --fix does not carry it out

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"check": self.check, "severity": self.severity, "detail": self.detail, "fix": self.fix}
        for name in ("run_id", "key", "path"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        body["fixed"] = self.fixed
        body["fixable"] = not self.manual  # False: the fix needs a restart or a person
        return body


# -- the checks (pure) ------------------------------------------------------------------------------


def diagnose(snap: Snapshot) -> list[Finding]:
    findings: list[Finding] = []
    by_run: dict[str, list[RunFolder]] = {}
    for folder in snap.folders:
        by_run.setdefault(folder.run_id, []).append(folder)
    active_runs: dict[str, RunFolder] = {}
    ambiguous = set()
    for run_id, places in sorted(by_run.items()):
        if len(places) > 1:
            ambiguous.add(run_id)
            findings.extend(_duplicates(run_id, places, snap.rows.get(run_id), snap.live))
            continue
        folder = places[0]
        if folder.state in ACTIVE:
            active_runs[run_id] = folder
        if not folder.young:
            findings.extend(_check_folder(folder, snap.rows.get(run_id), snap.live))
    findings.extend(_check_rows(snap, by_run))
    if snap.live is not None:
        active_runs = {rid: f for rid, f in active_runs.items() if rid in snap.live}
    findings.extend(_check_entries(snap, active_runs, ambiguous))
    findings.extend(
        Finding(
            "stray_tmp",
            "info",
            f"{path} is a temp file left by an interrupted write",
            "delete it",
            kind="remove_tmp",
            path=path,
        )
        for path in snap.tmp_files
    )
    return findings


def _check_folder(folder: RunFolder, row: Mapping[str, Any] | None, live: frozenset[str] | None) -> list[Finding]:
    run_id = folder.run_id
    where = f"{folder.state}/{run_id}"
    if folder.metadata is None:
        detail = f"{where} has no readable metadata.json"
        kind: FixKind
        if folder.empty:
            fix, kind = "remove the folder (it holds no message: a run whose start was interrupted)", "remove_folder"
        elif row is not None and row.get("metadata"):
            fix, kind = "rewrite metadata.json from the run's tasks.db row", "restore_metadata"
        else:
            fix, kind = f"move the folder to contexts/{SET_ASIDE}/ for a person to look at", "set_aside"
        return [Finding("unreadable_metadata", "error", detail, fix, kind=kind, run_id=run_id, status=folder.state)]
    if live is not None and folder.state in ACTIVE and run_id not in live:
        return [
            Finding(
                "unrecovered_folder",
                "warning",
                f"run folder {where} is not held by the running gateway",
                RESTART,
                run_id=run_id,
                manual=True,
            )
        ]
    if row is None:
        return [
            Finding(
                "orphan_folder",
                "warning",
                f"run folder {where} has no tasks.db row",
                f"insert its tasks.db row from metadata.json with status {folder.state}",
                kind="insert_row",
                run_id=run_id,
                status=folder.state,
            )
        ]
    if folder_for(str(row["status"])) != folder.state:
        return [
            Finding(
                "wrong_state_folder",
                "warning",
                f"run {run_id} is {row['status']} in tasks.db but its folder is in {folder.state}/",
                f"set its tasks.db status to {folder.state} (the folder is the truth)",
                kind="set_row_status",
                run_id=run_id,
                status=folder.state,
            )
        ]
    return []


def _duplicates(
    run_id: str, places: list[RunFolder], row: Mapping[str, Any] | None, live: frozenset[str] | None
) -> list[Finding]:
    """A run with folders in several states: the one tasks.db names stays (else the furthest
    along: completed, paused, running); the others are moved aside, never deleted."""
    states = ", ".join(sorted(p.state for p in places))
    keep: str | None = folder_for(str(row["status"])) if row is not None else None
    if keep not in {p.state for p in places}:
        keep = max((p.state for p in places), key=lambda s: ("running", "paused", "completed").index(s))
    if live is not None and run_id in live:  # the daemon holds it: its own folder stays, the others go
        keep = next(p.state for p in places if p.young)  # check_store marks the held one young
    return [
        Finding(
            "duplicate_folder",
            "error",
            f"run {run_id} has folders in {states}",
            f"keep {keep}/{run_id}; move {place.state}/{run_id} to contexts/{SET_ASIDE}/",
            kind="set_aside",
            run_id=run_id,
            status=place.state,
        )
        for place in places
        if place.state != keep
    ]


def _check_rows(snap: Snapshot, by_run: Mapping[str, list[RunFolder]]) -> list[Finding]:
    findings = []
    for run_id, row in sorted(snap.rows.items()):
        if run_id in by_run:
            continue
        if row["status"] in ACTIVE:
            findings.append(
                Finding(
                    "missing_folder",
                    "error",
                    f"tasks.db says run {run_id} is {row['status']} but it has no run folder",
                    "mark the run failed in tasks.db ('run folder missing')",
                    kind="settle_row",
                    run_id=run_id,
                    status="failed",
                )
            )
        elif run_id not in snap.archives and row.get("error_message") != LOST:
            findings.append(
                Finding(
                    "missing_folder",
                    "warning",
                    f"run {run_id} is {row['status']} but neither its folder nor its archive exists",
                    "mark the run failed in tasks.db ('run folder missing'), so it is not reported again",
                    kind="settle_row",
                    run_id=run_id,
                    status="failed",
                )
            )
    return findings


def _check_entries(snap: Snapshot, active_runs: Mapping[str, RunFolder], ambiguous: set[str]) -> list[Finding]:
    findings = []
    pointed = {run_id for run_id in snap.entries.values() if run_id}
    for key, run_id in sorted(snap.entries.items()):
        if run_id is not None and run_id not in active_runs and run_id not in ambiguous:
            findings.append(
                Finding(
                    "stale_entry",
                    "warning",
                    f"sessions.json entry {key!r} points at run {run_id}, which is not active",
                    "set the entry idle (run_id null), keeping its settings",
                    kind="idle_entry",
                    key=key,
                    run_id=run_id,
                )
            )
    for run_id, folder in sorted(active_runs.items()):
        key = str((folder.metadata or {}).get("session_key") or "")
        if run_id in pointed or not key:
            continue
        findings.append(
            Finding(
                "missing_entry",
                "warning",
                f"active run {run_id} of {key!r} has no sessions.json entry pointing at it",
                f"point the entry of {key!r} at the run",
                kind="point_entry",
                key=key,
                run_id=run_id,
                status=folder.state,
            )
        )
    return findings
