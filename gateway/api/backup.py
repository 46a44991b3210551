"""Backups through the running gateway: ``POST /v1/admin/backup`` takes one (what ``neotask
backup`` calls while a daemon runs), ``GET /v1/admin/backups`` lists the backup folder."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from backups import retention
from backups.errors import BackupInvalid, BackupRunning, BackupTargetError
from config.errors import PayloadTooLarge
from gateway import keys as K
from gateway.contract import operation
from gateway.http import json_response, parse_body

routes = web.RouteTableDef()


class BackupBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    output: str | None = Field(
        None, min_length=1, description="the archive to write (a path on the gateway's host); default <home>/backups"
    )


@routes.post("/v1/admin/backup")
@operation(
    "Take a backup of the home now",
    "admin",
    "One .tar.gz holding a consistent point of the home (tasks.db, sessions.json, every run up to its"
    " seq at the point, archives, workspaces, memory tables, config) and a manifest with checksums."
    " Without `output` it goes to <home>/backups and backups beyond `backup.keep` are pruned.",
    body=BackupBody,
    body_required=False,
    errors=(BackupTargetError, BackupRunning, BackupInvalid, PayloadTooLarge),
)
async def take_backup(request: web.Request) -> web.Response:
    body = await parse_body(request, BackupBody, request.app[K.CONFIG].settings.gateway.max_body_bytes, optional=True)
    backups = request.app[K.SERVICES].backups
    summary = await backups.take(Path(body.output) if body.output else None)
    return json_response(summary)


@routes.get("/v1/admin/backups")
@operation("The backups in <home>/backups, newest first", "admin")
async def list_backups(request: web.Request) -> web.Response:
    home = request.app[K.CONFIG].home
    found = await asyncio.to_thread(retention.list_backups, home)
    last = request.app[K.SERVICES].backups.last
    return json_response({"backups": found, "last": last, "keep": request.app[K.CONFIG].settings.backup.keep})
