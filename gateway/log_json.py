"""Structured logs (issue 29 item 4): ``logging.format: json`` writes one JSON object per line
with ``time``, ``level``, ``logger``, ``message`` and, where known, the ``request_id``,
``session_key``, ``run_id`` and ``agent`` of the request or turn that logged it (null otherwise).

The ids live in context variables: the front middleware binds the request id (and clears all
four when the request is done: a keep-alive connection serves its next request in the same task),
the turn code binds the session key, agent and run id. :class:`ContextFilter` copies them onto
each record where it is logged (the formatting happens later, on the log thread, in another
context)."""

from __future__ import annotations

import contextvars
import json
import logging
from datetime import UTC, datetime

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
SESSION_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("session_key", default=None)
RUN_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("run_id", default=None)
AGENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("agent", default=None)
FIELDS = {"request_id": REQUEST_ID, "session_key": SESSION_KEY, "run_id": RUN_ID, "agent": AGENT}


def clear() -> None:
    for var in FIELDS.values():
        var.set(None)


def bind_turn(key: str, agent: str | None, run_id: str | None = None) -> None:
    SESSION_KEY.set(key)
    AGENT.set(agent)
    if run_id is not None:
        RUN_ID.set(run_id)


class ContextFilter(logging.Filter):
    """Copies the ids of the current context onto the record (never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, var in FIELDS.items():
            if not hasattr(record, name):
                setattr(record, name, var.get())
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            message = f"{message}\n{record.exc_text}"
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        for name in FIELDS:
            line[name] = getattr(record, name, None)
        return json.dumps(line, ensure_ascii=False, default=str)
