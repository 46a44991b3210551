"""What a log line is about: the ids of the request or turn that logged it, in context variables.

The front middleware (``gateway/app.py``) binds the request id and clears all four when the request
is done (a keep-alive connection serves its next request in the same task); the turn code binds the
session key, agent and run id. ``gateway/log_json.py`` copies them onto each record and writes
them; ``gateway/logs.py``'s repeat filter lets every record marked ``EVERY_ONE`` through."""

from __future__ import annotations

import contextvars

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
SESSION_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("session_key", default=None)
RUN_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("run_id", default=None)
AGENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("agent", default=None)
FIELDS = {"request_id": REQUEST_ID, "session_key": SESSION_KEY, "run_id": RUN_ID, "agent": AGENT}

EACH = "each"  # ``log.info(..., extra=EVERY_ONE)``: a record about one thing (a key's reset) is never a repeat
EVERY_ONE = {EACH: True}


def clear() -> None:
    for var in FIELDS.values():
        var.set(None)


def bind_turn(key: str, agent: str | None, run_id: str | None = None) -> None:
    SESSION_KEY.set(key)
    AGENT.set(agent)
    if run_id is not None:
        RUN_ID.set(run_id)
