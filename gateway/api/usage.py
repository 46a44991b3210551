"""Token usage per UTC day, agent and key: ``GET /v1/usage``, with each agent's
daily budgets (``agents.<id>.limits``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date
from typing import cast

from aiohttp import web

from config.errors import BadRequest
from gateway import keys as K
from gateway.contract import NULLABLE_STR, STR, Answer, ChoiceParam, Param, operation
from gateway.http import json_response
from sessions.usage import USAGE_COLUMNS, UsageBy, UsageQuery

routes = web.RouteTableDef()

AGENT = Param("agent", "only this agent's usage (a configured agent id)")
KEY = Param("key", "only this session key's usage (the key as written, `agent:main:main`)")
SINCE = Param("from", "first UTC day, inclusive (YYYY-MM-DD)", schema={"type": "string", "format": "date"})
UNTIL = Param("to", "last UTC day, inclusive (YYYY-MM-DD)", schema={"type": "string", "format": "date"})
BY = ChoiceParam(
    "by",
    "one row per day and key (`key`), per day and agent (`agent`, the keys summed) or per day (`day`)",
    choices=("key", "agent", "day"),
    default="key",
)
COUNT = {"type": "integer", "minimum": 0}
LIMIT = {"type": ["integer", "null"], "minimum": 1}
USAGE = Answer(
    "Usage",
    {
        "type": "object",
        "required": ["by", "from", "to", "usage", "totals", "limits"],
        "properties": {
            "by": {"enum": ["key", "agent", "day"]},
            "from": NULLABLE_STR,
            "to": NULLABLE_STR,
            "usage": {
                "type": "array",
                "description": "oldest day first",
                "items": {
                    "type": "object",
                    "required": ["day", "agent", "key", "total_tokens", *USAGE_COLUMNS],
                    "properties": {
                        "day": STR,
                        "agent": NULLABLE_STR,
                        "key": NULLABLE_STR,
                        "total_tokens": {**COUNT, "description": "input plus output tokens (what budgets count)"},
                        **dict.fromkeys(USAGE_COLUMNS, COUNT),
                    },
                },
            },
            "totals": {"type": "object", "properties": dict.fromkeys(("total_tokens", *USAGE_COLUMNS), COUNT)},
            "limits": {
                "type": "object",
                "description": "each agent's daily budgets (agents.<id>.limits)",
                "additionalProperties": {
                    "type": "object",
                    "properties": {"tokens_per_day": LIMIT, "tokens_per_key_per_day": LIMIT},
                },
            },
        },
    },
)


def _day(request: web.Request, param: Param) -> date | None:
    raw = param.raw(request)
    if not raw:
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise param.refuse(f"must be a day written YYYY-MM-DD, not {raw!r}") from None


@routes.get("/v1/usage")
@operation(
    "Token usage per UTC day, agent and key",
    "usage",
    "Counted per model call of the agents' turns and memory flushes, by the UTC day it answered on;"
    " `limits` are the daily budgets a message needing a turn is checked against.",
    params=(AGENT, KEY, SINCE, UNTIL, BY),
    answer=USAGE,
    errors=(BadRequest,),
)
async def usage(request: web.Request) -> web.Response:
    settings = request.app[K.CONFIG].settings
    agent = AGENT.raw(request) or None
    if agent is not None and agent not in settings.agents:
        known = ", ".join(sorted(settings.agents))
        raise BadRequest(f"agent {agent!r} is not configured (agents: {known})", field="agent")
    since, until = _day(request, SINCE), _day(request, UNTIL)
    if since is not None and until is not None and since > until:
        raise BadRequest(f"'from' ({since}) is after 'to' ({until}): swap them", field="from")
    by: UsageBy = BY.read(request) or "key"  # type: ignore[assignment]
    rows = await request.app[K.STORE].daily_usage(UsageQuery(agent, KEY.raw(request) or None, since, until, by))
    counted = [cast(Mapping[str, int], r) for r in rows]
    totals = {name: sum(int(r[name]) for r in counted) for name in ("total_tokens", *USAGE_COLUMNS)}
    limits = {agent_id: a.limits.model_dump() for agent_id, a in settings.agents.items()}
    return json_response(
        {
            "by": by,
            "from": None if since is None else since.isoformat(),
            "to": None if until is None else until.isoformat(),
            "usage": rows,
            "totals": totals,
            "limits": limits,
        }
    )
