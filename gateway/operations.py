"""Application-level operations that a route and the offline CLI both do, written once over the
composition root's objects (``gateway/services.py``): the same call answers ``GET /v1/sessions``
and ``neotask sessions list`` without a daemon, ``/reset`` and ``neotask sessions reset``, a cron
job run now, the doctor."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from config.errors import BadRequest
from conversations.commands import Commands, dispatch
from conversations.housekeeping import CronOutcome
from conversations.run_end import RunEnd, end_run
from conversations.turns import Conversations, Outcome, Post
from gateway.views import session_view
from sessions.entries import SessionEntry
from sessions.history_index import HistoryIndexProtocol
from sessions.keys import SessionKey
from sessions.protocol import StoreProtocol
from sessions.records import CHAT_TYPES, ENTRY_STATUSES, NewMessage

if TYPE_CHECKING:
    from scheduler.service import SchedulerService

STATUSES = ENTRY_STATUSES


def sort_key(entry: SessionEntry) -> tuple[str, str]:
    """Newest activity first (sorted in reverse), the key breaking ties."""
    return (entry.last_interaction_at or entry.created_at, entry.key)


def matching_sessions(
    store: StoreProtocol, *, agent: str | None, chat_type: str | None, status: str | None
) -> list[SessionEntry]:
    """The entries a listing shows, newest activity first; a bad filter is a 400."""
    if status is not None and status not in STATUSES:
        raise BadRequest(f"'status' must be {', '.join(STATUSES[:-1])} or {STATUSES[-1]}", field="status")
    if chat_type is not None and chat_type not in CHAT_TYPES:
        raise BadRequest(f"'type' must be {', '.join(CHAT_TYPES[:-1])} or {CHAT_TYPES[-1]}", field="type")
    entries = [
        e
        for e in store.entries()
        if (agent is None or e.agent_id == agent)
        and (chat_type is None or e.chat_type == chat_type)
        and (status is None or e.status == status)
    ]
    entries.sort(key=sort_key, reverse=True)
    return entries


def encode_cursor(position: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(position).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        at, key = json.loads(base64.urlsafe_b64decode(padded))
        return str(at), str(key)
    except (ValueError, TypeError):
        raise BadRequest("'cursor' is not one this API returned; start again without it", field="cursor") from None


def page_of(entries: list[SessionEntry], *, limit: int, cursor: str | None) -> tuple[list[SessionEntry], str | None]:
    """One page of a listing (``matching_sessions``) after ``cursor``, and the next page's cursor."""
    if cursor:
        position = decode_cursor(cursor)
        entries = [e for e in entries if sort_key(e) < position]
    page = entries[:limit]
    return page, encode_cursor(sort_key(page[-1])) if len(entries) > limit else None


def describe_session(commands: Commands, key: str) -> dict[str, Any]:
    """``GET /v1/sessions/{key}``: the entry with its token figures (the context plus the system
    prompt and the tool schemas the model is sent), the next reset and the model."""
    return _describe(commands, commands.store.require_entry(key))


def describe_sessions(commands: Commands, entries: Iterable[SessionEntry]) -> list[dict[str, Any]]:
    return [_describe(commands, e) for e in entries]


def _describe(commands: Commands, entry: SessionEntry) -> dict[str, Any]:
    conv = commands.conv
    key = entry.key
    return session_view(
        entry,
        conv.store.active_run(key),
        threshold=conv.threshold(entry.agent_id),
        overhead=conv.context_overhead(entry.agent_id),
        next_reset=commands.next_reset(key) if commands.next_reset else None,
        model=conv.model_name(key, entry.agent_id) if conv.provider(entry.agent_id) else None,
    )


async def run_command(commands: Commands, key: SessionKey, command: str) -> Outcome:
    """A chat command on an existing session (``/reset``, ``/compact ...``): an unknown key is
    404, not a new session."""
    commands.store.require_entry(key.raw)
    return await dispatch(commands, Post(key=key, message=NewMessage(role="user", content=command)))


async def run_job(scheduler: SchedulerService, job_id: str, *, at: str) -> dict[str, Any]:
    """Run a scheduler job now (``POST /v1/scheduler/jobs/{id}/run``, ``neotask cron run``):
    ``ok`` false when a cron job's turn failed or its delivery did not arrive, with the reason."""
    resolved = scheduler.resolve(job_id)
    result = await scheduler.run_now(resolved)
    body: dict[str, Any] = {"job_id": resolved, "ran": True, "at": at, "ok": True}
    if isinstance(result, CronOutcome):
        body.update(result.as_dict())
    return body


async def delete_session(conv: Conversations, key: str) -> dict[str, Any]:
    """Stop the key's turn, complete its active run (final summary) and remove the entry."""
    conv.store.require_entry(key)
    conv.stop_turn(key)
    async with conv.exclusive(key):
        ended = await end_run(conv, key, RunEnd("delete"))
        await conv.store.delete(key)
    completed = ended[0].run_id if ended is not None else None
    return {"session_key": key, "deleted": True, "completed_run_id": completed}


async def doctor(store: StoreProtocol, history: HistoryIndexProtocol | None, *, fix: bool) -> list[dict[str, Any]]:
    """The doctor inside a running gateway (``POST /v1/admin/doctor``): the store's checks, then
    the history index's."""
    findings = await store.check(fix=fix)
    if history is not None:
        findings += await store.check_history(history, fix=fix)
    return findings
