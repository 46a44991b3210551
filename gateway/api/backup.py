"""Backups through the running gateway: ``POST /v1/admin/backup`` takes one (what ``neotask
backup`` calls while a daemon runs), ``GET /v1/admin/backups`` lists the backup folder."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web
from pydantic import Field, field_validator

from backups import retention
from backups.errors import BackupInvalid, BackupRunning, BackupTargetError
from config.errors import PayloadTooLarge
from gateway import keys as K
from gateway.contract import NULLABLE_STR, STR, Answer, operation
from gateway.http import Strict, json_response, parse_body

routes = web.RouteTableDef()

INT = {"type": "integer"}
COUNTS = {
    "type": "object",
    "properties": {
        name: INT for name in ("files", "bytes", "runs", "active_runs", "archives", "memory_files", "workspace_files")
    },
}
SUMMARY = {
    "type": "object",
    "required": ["path", "size", "created_at", "mode", "counts", "point"],
    "properties": {
        "path": STR,
        "size": INT,
        "created_at": STR,
        "mode": {"enum": ["online", "offline"]},
        "counts": COUNTS,
        "point": {
            "type": "object",
            "description": "when, and for each active run (by uuid) its state and the last seq the backup holds",
            "properties": {"at": NULLABLE_STR, "runs": {"type": "object"}},
        },
        "notes": {"type": "object", "description": "`skipped`: what was outside the home and is not in the archive"},
        "pruned": {"type": "array", "items": STR, "description": "older backups deleted (`backup.keep`)"},
    },
}
BACKUP = Answer("Backup", SUMMARY)
BACKUPS = Answer(
    "Backups",
    {
        "type": "object",
        "required": ["backups", "keep"],
        "properties": {
            "backups": {
                "type": "array",
                "items": {"type": "object", "properties": {"name": STR, "path": STR, "size": INT}},
            },
            "last": {"oneOf": [{"type": "null"}, SUMMARY], "description": "the last backup this gateway took"},
            "keep": INT,
        },
    },
)


class BackupBody(Strict):
    output: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        pattern=r"^[^\x00]+$",  # no file system takes a NUL in a path
        description="the archive to write: an absolute path on the gateway's host; default <home>/backups",
    )

    @field_validator("output")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        # a relative path would land in the daemon's working folder, wherever that is
        if value is not None and not Path(value).expanduser().is_absolute():
            raise ValueError("give an absolute path (neotask backup -o makes its path absolute)")
        return value


@routes.post("/v1/admin/backup")
@operation(
    "Take a backup of the home now",
    "admin",
    "One .tar.gz holding a consistent point of the home (tasks.db, sessions.json, every run up to its"
    " seq at the point, archives, workspaces, memory tables, config) and a manifest with checksums."
    " Without `output` it goes to <home>/backups and backups beyond `backup.keep` are pruned. With"
    " `storage.backend: postgres` the sessions come from one REPEATABLE READ snapshot of the database,"
    " written as a files home in the same format (manifest `backend: postgres`; `neotask restore --to` puts"
    " them back into an empty database).",
    body=BackupBody,
    body_required=False,
    answer=BACKUP,
    errors=(BackupTargetError, BackupRunning, BackupInvalid, PayloadTooLarge),
)
async def take_backup(request: web.Request) -> web.Response:
    body = await parse_body(request, BackupBody, request.app[K.CONFIG].settings.gateway.max_body_bytes, optional=True)
    backups = request.app[K.SERVICES].backups
    summary = await backups.take(Path(body.output) if body.output else None)
    return json_response(summary)


@routes.get("/v1/admin/backups")
@operation("The backups in <home>/backups, newest first", "admin", answer=BACKUPS)
async def list_backups(request: web.Request) -> web.Response:
    home = request.app[K.CONFIG].home
    found = await asyncio.to_thread(retention.list_backups, home)
    last = request.app[K.SERVICES].backups.last
    return json_response({"backups": found, "last": last, "keep": request.app[K.CONFIG].settings.backup.keep})
