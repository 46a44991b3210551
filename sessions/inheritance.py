"""Context inheritance (SPEC section 6, seed 000 ContextInheritanceManager): a new run of a key
starts from the final summary and planning history of the key's previous run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from config.settings import InheritanceSettings
from sessions.files import layout
from sessions.files.jsonl import read_records
from sessions.files.ledger import run_metadata
from sessions.files.store import SessionStore
from sessions.records import TaskKey
from sessions.tokens import estimate_text

ArchiveText = Callable[[str, str], Awaitable[str | None]]


@dataclass(frozen=True)
class Inheritance:
    run_id: str
    status: str
    ended_at: str
    message: str  # the first context message of the new run
    comment: str  # the notification comment for the reply

    def event(self) -> dict[str, Any]:
        return {"type": "inheritance", "run_id": self.run_id, "ended_at": self.ended_at, "comment": self.comment}


def truncate(text: str, max_tokens: int) -> str:
    """Cut to ``max_tokens`` (estimated) with a visible marker saying how much was left out."""
    total = estimate_text(text)
    if total <= max_tokens:
        return text
    ratio = max_tokens / total
    keep = max(0, int(len(text) * ratio) - 80)
    omitted = total - estimate_text(text[:keep])
    return text[:keep].rstrip() + f"\n[... truncated: about {omitted} tokens of the earlier summary omitted]"


def planning_summary(plans: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"- {p.get('created_at', '?')} [{p.get('plan_type', 'plan')}] {p.get('plan_content', '')}" for p in plans
    )


def notification(run_id: str, status: str, ended_at: str) -> str:
    return f"Continuing from the previous session (run {run_id}, {status} at {ended_at})."


def build_message(
    *, run_id: str, status: str, ended_at: str, final_summary: str, plans: list[dict[str, Any]], max_tokens: int
) -> str:
    parts = [f"Summary of the previous session (run {run_id}, {status} at {ended_at}):", final_summary.strip()]
    if plans:
        parts += ["", "Planning history:", planning_summary(plans)]
    parts += ["", "Continue the work from here; the earlier messages are not in this context."]
    return truncate("\n".join(parts), max_tokens)


async def find_inheritance(
    store: SessionStore,
    *,
    key: str,
    task_key: TaskKey | None,
    settings: InheritanceSettings,
    archive_text: ArchiveText | None = None,
) -> Inheritance | None:
    """The newest completed or failed run of the key (for hooks, also of the seed's task key)
    within ``expiry_days``, as the message that opens the next run."""
    rows = await store.ledger.previous_runs(
        session_key=key,
        task_key=task_key.as_dict() if task_key is not None else None,
        since=store.expiry_cutoff(settings.expiry_days),
    )
    for row in rows:
        if run_metadata(row.get("metadata")).get("inherit") is False:  # its session was deleted
            continue
        summary, plans = await _load(store, row, archive_text)
        if summary is None and not plans:
            continue
        ended = str(row["completed_at"])
        message = build_message(
            run_id=row["uuid"], status=row["status"], ended_at=ended, final_summary=summary or "(no final summary)",
            plans=plans, max_tokens=settings.max_summary_tokens,
        )  # fmt: skip
        return Inheritance(row["uuid"], row["status"], ended, message, notification(row["uuid"], row["status"], ended))
    return None


async def _load(
    store: SessionStore, row: dict[str, Any], archive_text: ArchiveText | None
) -> tuple[str | None, list[dict[str, Any]]]:
    folder = store.home.run_dir(row["uuid"], "completed")

    def _read() -> tuple[str | None, list[dict[str, Any]]] | None:
        if not folder.is_dir():
            return None
        return _text(folder / layout.FINAL_SUMMARY), read_records(folder / layout.PLANNING)

    found = await asyncio.to_thread(_read)
    if found is not None:
        return found
    if archive_text is None:
        return None, []
    summary = await archive_text(row["uuid"], layout.FINAL_SUMMARY)
    planning = await archive_text(row["uuid"], layout.PLANNING)
    plans = [json.loads(x) for x in (planning or "").splitlines() if x.strip()]
    return summary, plans


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
