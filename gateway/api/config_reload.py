"""``POST /v1/admin/config/reload``: read the config file again and put it in force (what SIGHUP
and ``neotask config reload`` do; ``gateway/reload.py``)."""

from __future__ import annotations

from aiohttp import web

from config.errors import PayloadTooLarge
from gateway import keys as K
from gateway.contract import NULLABLE_STR, STR, Answer, operation
from gateway.http import json_response, read_body
from gateway.reload import RELOADS, ConfigRejected

routes = web.RouteTableDef()

PATHS = {"type": "array", "items": STR}
RELOAD = Answer(
    "ConfigReload",
    {
        "type": "object",
        "required": ["reloaded", "trigger", "changed", "restart_required", "since"],
        "properties": {
            "reloaded": {"type": "boolean", "description": "false: the file holds nothing new that can change now"},
            "trigger": {"enum": ["api", "SIGHUP"]},
            "changed": {**PATHS, "description": "dotted keys now in force with their new value"},
            "restart_required": {
                **PATHS,
                "description": "changed keys that keep their running value",
            },
            "since": {**STR, "description": "when the settings in force came in force"},
            "config_path": NULLABLE_STR,
            "workers": {
                "type": "array",
                "description": "under `--workers N`: each worker's outcome (the fields above, or `error`)",
                "items": {"type": "object", "required": ["worker"], "additionalProperties": True},
            },
        },
    },
)


@routes.post("/v1/admin/config/reload")
@operation(
    "Reload the configuration file",
    "admin",
    "Reads the config file again with the environment the gateway started with and checks it as at"
    " start. Agents, models, bindings, tokens, reset policies, cron jobs, memory search and recall,"
    " hooks and channels change at once, without a restart or a dropped connection; `changed` lists"
    " the keys now in force, `restart_required` those that keep their running value until a restart"
    " (home, listening address, storage backend, ...). An invalid file changes nothing: 400"
    " `config_rejected` naming the key.",
    answer=RELOAD,
    errors=(ConfigRejected, PayloadTooLarge),
)
async def reload_config(request: web.Request) -> web.Response:
    await read_body(request, request.app[K.CONFIG].settings.gateway.max_body_bytes)
    answer = await request.app[RELOADS].reload_all(request.app)
    return json_response(answer)
