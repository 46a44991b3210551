"""Context inheritance (SPEC section 6, seed 000 ContextInheritanceManager): a new run of a key
starts from the final summary and planning history of the key's previous run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from config.errors import RunNotFound
from config.settings import InheritanceSettings
from sessions.events import InheritanceEvent
from sessions.protocol import RunStore
from sessions.records import StoredRecord, TaskKey
from sessions.tokens import estimate_text


@dataclass(frozen=True)
class Inheritance:
    run_id: str
    status: str
    ended_at: str
    message: str  # the first context message of the new run
    comment: str  # the notification comment for the reply

    def event(self) -> InheritanceEvent:
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
    store: RunStore, *, key: str, task_key: TaskKey | None, settings: InheritanceSettings
) -> Inheritance | None:
    """The newest completed or failed run of the key (for hooks, also of the seed's task key)
    within ``expiry_days``, as the message that opens the next run."""
    rows = await store.previous_runs(key=key, task_key=task_key, within_days=settings.expiry_days)
    for row in rows:
        summary, plans = await _load(store, row["uuid"])
        if summary is None and not plans:
            continue
        ended = str(row["completed_at"])
        message = build_message(
            run_id=row["uuid"], status=row["status"], ended_at=ended, final_summary=summary or "(no final summary)",
            plans=plans, max_tokens=settings.max_summary_tokens,
        )  # fmt: skip
        return Inheritance(row["uuid"], row["status"], ended, message, notification(row["uuid"], row["status"], ended))
    return None


async def _load(store: RunStore, run_id: str) -> tuple[str | None, list[StoredRecord]]:
    """The run's final summary and planning records (from wherever its backend keeps an ended or
    archived run); nothing when they cannot be read any more."""
    try:
        return await store.read_final_summary(run_id), await store.read_records(run_id, "planning")
    except RunNotFound:
        return None, []
