"""Structured logs: ``logging.format: json`` writes one JSON object per line
with ``time``, ``level``, ``logger``, ``message`` and, where known, the ``request_id``,
``session_key``, ``run_id`` and ``agent`` of the request or turn that logged it (null otherwise).

The ids live in context variables (``conversations/log_context.py``, the engine binds them too):
the front middleware binds the request id (and clears all four when the request is done: a
keep-alive connection serves its next request in the same task), the turn code binds the session
key, agent and run id. :class:`ContextFilter` copies them onto
each record where it is logged (the formatting happens later, on the log thread, in another
context)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from conversations.log_context import AGENT, FIELDS, REQUEST_ID, RUN_ID, SESSION_KEY, bind_turn, clear

__all__ = [  # the context variables stay importable from here (the front middleware sets them)
    "AGENT", "FIELDS", "REQUEST_ID", "RUN_ID", "SESSION_KEY", "ContextFilter", "JsonFormatter", "bind_turn", "clear"
]  # fmt: skip


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
