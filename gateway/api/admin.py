"""Administration: consistency checks over the home (``POST /v1/admin/doctor``)."""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from gateway import keys as K
from gateway.api.history import HISTORY
from gateway.contract import operation
from gateway.http import json_response, parse_body
from sessions.doctor import check_store
from sessions.history_doctor import check_index

routes = web.RouteTableDef()


class DoctorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fix: bool = False


@routes.post("/v1/admin/doctor")
@operation("Consistency checks (answers the actions)", "admin", body=DoctorBody, body_required=False)
async def doctor(request: web.Request) -> web.Response:
    """Every finding as ``{check, severity, detail, fix, fixed}``; with ``fix: true`` the safe
    fixes are applied and marked ``fixed``."""
    config = request.app[K.CONFIG]
    body = await parse_body(request, DoctorBody, config.settings.gateway.max_body_bytes, optional=True)
    store = request.app[K.STORE]
    findings = await check_store(store, fix=body.fix)
    history = request.app.get(HISTORY)
    if history is not None:
        findings += await check_index(history, store.ledger, store.home, fix=body.fix)
    return json_response({"actions": [f.as_dict() for f in findings]})
