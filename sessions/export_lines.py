"""Exporting runs as JSON Lines or Markdown, streamed, the same bytes on every backend: messages
come one at a time from each run's ``ExportReader`` (``sessions.exports``), so a 100,000-message
run exports in constant memory. Summaries (compaction and uncompact markers) are placed where they
happened (by time, before the first message written after them); the final summary closes each
run. Blocking generators: callers pull them off the event loop."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

from sessions.exports import RunExport

__all__ = ["ExportFormat", "export_lines", "jsonl_lines", "markdown_lines"]

ExportFormat = Literal["jsonl", "md"]
RUN_FIELDS = ("uuid", "session_key", "agent_id", "chat_type", "channel", "status", "created_at", "completed_at",
              "parent_uuid", "archived_at")  # fmt: skip


def _events(run: RunExport) -> Iterator[tuple[str, dict[str, Any]]]:
    """("run" | "message" | "summary" | "final_summary", record) in the order they happened."""
    summaries, final = run.reader.summaries(), run.reader.final_summary()
    messages = run.reader.messages()
    summaries.sort(key=lambda s: str(s.get("created_at") or ""))
    yield "run", {k: run.row.get(k) for k in RUN_FIELDS} | {"run_id": run.row["uuid"]}
    pending = 0
    for message in messages:
        stamp = str(message.get("timestamp") or "")
        while pending < len(summaries) and str(summaries[pending].get("created_at") or "") < stamp:
            yield "summary", summaries[pending]
            pending += 1
        yield "message", message
    for summary in summaries[pending:]:
        yield "summary", summary
    if final is not None:
        yield "final_summary", {"run_id": run.row["uuid"], "content": final}


def jsonl_lines(runs: list[RunExport]) -> Iterator[str]:
    """One JSON object per line, each with ``type``: ``run``, ``message``, ``compaction`` or
    ``uncompact`` (summaries.jsonl records), ``final_summary``."""
    for run in runs:
        for kind, record in _events(run):
            if kind == "message":
                body = {"type": "message", "run_id": run.row["uuid"], **record}
            elif kind == "summary":
                body = {**record, "type": record.get("type") or "compaction", "run_id": run.row["uuid"]}
            else:
                body = {"type": kind, **record}
            yield json.dumps(body, ensure_ascii=False) + "\n"


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines() or [""])


def _md_message(m: dict[str, Any]) -> str:
    role = str(m.get("role") or "?")
    who = f" ({m['name']})" if m.get("name") else ""
    tags = []
    if m.get("command"):
        tags.append("command")
    if m.get("kind"):
        tags.append(str(m["kind"]))
    if role == "tool" and m.get("tool_name"):
        tags.append(f"tool result of `{m['tool_name']}`")
    tag = f" — {', '.join(tags)}" if tags else ""
    head = f"**{role}**{who} · {m.get('timestamp') or ''} · #{m.get('seq')}{tag}\n\n"
    content = str(m.get("content") or "")
    body = f"```\n{content}\n```" if role == "tool" else content
    calls = []
    for call in m.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            calls.append(f"- calls `{function.get('name')}` with `{function.get('arguments')}`")
    return head + body + ("\n\n" + "\n".join(calls) if calls else "") + "\n\n"


def _md_summary(s: dict[str, Any]) -> str:
    if s.get("type") == "uncompact":
        return f"> **Uncompact** · {s.get('created_at')} · compaction {s.get('reverts')} reverted\n\n"
    head = (
        f"> **Compaction {s.get('compaction_count')}** · {s.get('created_at')} · messages {s.get('start_seq')} to "
        f"{s.get('end_seq')} · {s.get('trigger')} · {s.get('summarizer')}\n>\n"
    )
    return head + _quote(str(s.get("summary") or "")) + "\n\n"


def markdown_lines(runs: list[RunExport], *, title: str) -> Iterator[str]:
    yield f"# {title}\n\n"
    for run in runs:
        for kind, record in _events(run):
            if kind == "run":
                archived = "yes" if record.get("archived_at") else "no"
                yield (
                    f"## Run {record['run_id']}\n\n- key: `{record.get('session_key')}`\n- status: "
                    f"{record.get('status')}\n- started: {record.get('created_at')}\n- completed: "
                    f"{record.get('completed_at') or '—'}\n- archived: {archived}\n\n"
                )
            elif kind == "message":
                yield _md_message(record)
            elif kind == "summary":
                yield _md_summary(record)
            else:
                yield f"### Final summary\n\n{record['content'].rstrip()}\n\n"


def export_lines(runs: list[RunExport], fmt: ExportFormat, *, title: str) -> Iterator[str]:
    return jsonl_lines(runs) if fmt == "jsonl" else markdown_lines(runs, title=title)
