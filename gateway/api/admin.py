"""Administration: consistency checks over the home (``POST /v1/admin/doctor``) and the running
gateway's effective configuration (``GET /v1/admin/config``)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from config.clock import iso
from gateway import keys as K
from gateway import operations, validation
from gateway.contract import operation
from gateway.http import Strict, json_response, parse_body
from gateway.keys import HISTORY
from gateway.reload import RELOADS

routes = web.RouteTableDef()


class DoctorBody(Strict):
    fix: bool = False


@routes.get("/v1/admin/config")
@operation(
    "The running gateway's effective configuration",
    "admin",
    "Tokens redacted; `source` names the gateway, its config file and home, `settings` the merged"
    " settings in force with the address the gateway really listens on (what `neotask config show`"
    " prints while a daemon runs); `since`: when they came in force (the start, or the last reload"
    " that changed something), `reloads` how many reloads did, `last_reload` the last one's answer.",
)
async def effective_config(request: web.Request) -> web.Response:
    """The running gateway's effective configuration (tokens redacted), with the address it
    listens on (``neotask config show`` while a daemon runs)."""
    config = request.app[K.CONFIG]
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    host, port = (str(sockname[0]), int(sockname[1])) if isinstance(sockname, tuple) else (None, None)
    source = validation.config_source(config, "gateway")
    body: dict[str, Any] = {"source": source, "settings": validation.effective_config(config, host=host, port=port)}
    reloads = request.app.get(RELOADS)
    if reloads is not None:  # in force since the start or the last reload that changed something
        body["since"] = iso(reloads.since)
        body["reloads"] = reloads.count
        body["last_reload"] = reloads.last
        if reloads.fleet is not None:  # --workers N: each worker's since and reloads
            body["workers"] = await asyncio.to_thread(reloads.fleet.statuses)
    return json_response(body)


@routes.post("/v1/admin/doctor")
@operation("Consistency checks (answers the actions)", "admin", body=DoctorBody, body_required=False)
async def doctor(request: web.Request) -> web.Response:
    """Every finding as ``{check, severity, detail, fix, fixed}``; with ``fix: true`` the safe
    fixes are applied and marked ``fixed``."""
    config = request.app[K.CONFIG]
    body = await parse_body(request, DoctorBody, config.settings.gateway.max_body_bytes, optional=True)
    actions = await operations.doctor(request.app[K.STORE], request.app.get(HISTORY), fix=body.fix)
    return json_response({"actions": actions})
