"""Scheduled jobs and cleanup: ``GET /v1/scheduler/jobs``, run a job now, ``POST /v1/admin/cleanup``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from zoneinfo import ZoneInfo

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from config.clock import host_zone
from config.errors import JobNotFound, JobRunning, PayloadTooLarge
from gateway import keys as K
from gateway.contract import operation
from gateway.crashpoints import crash_step
from gateway.delivery import DELIVERY
from gateway.http import json_response, parse_body, read_body
from gateway.scheduling import Scheduling
from scheduler.service import DailyJob, SchedulerService
from sessions import archive
from sessions.resets import daily_boundaries

routes = web.RouteTableDef()
SCHEDULING = web.AppKey("scheduling", Scheduling)
SCHEDULER = web.AppKey("scheduler", SchedulerService)
DELIVERY_TIMEOUT_S = 10.0


class CleanupBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dry_run: bool = False


@routes.get("/v1/scheduler/jobs")
@operation("Scheduled jobs and their next run times", "scheduler")
async def list_jobs(request: web.Request) -> web.Response:
    return json_response({"jobs": [job.as_json() for job in request.app[SCHEDULER].jobs()]})


@routes.post("/v1/scheduler/jobs/{job_id}/run")
@operation("Run a job now", "scheduler", errors=(JobNotFound, JobRunning, PayloadTooLarge))
async def run_job(request: web.Request) -> web.Response:
    await read_body(request, request.app[K.CONFIG].settings.gateway.max_body_bytes)
    scheduler = request.app[SCHEDULER]
    job_id = scheduler.resolve(request.match_info["job_id"])
    await scheduler.run_now(job_id)
    return json_response({"job_id": job_id, "ran": True})


@routes.post("/v1/admin/cleanup")
@operation("Cleanup (answers the actions)", "admin", body=CleanupBody, body_required=False)
async def cleanup(request: web.Request) -> web.Response:
    limit = request.app[K.CONFIG].settings.gateway.max_body_bytes
    body = await parse_body(request, CleanupBody, limit, optional=True)
    actions = await request.app[SCHEDULING].cleanup(dry_run=body.dry_run)
    return json_response({"dry_run": body.dry_run, "actions": actions})


async def scheduler_context(app: web.Application) -> AsyncIterator[None]:
    """Resets, cleanup and cron jobs; a sweep runs once at start, in the background, so resets
    missed while the daemon was down happen without keeping the port unbound."""
    settings = app[K.CONFIG].settings
    env: dict[str, str] = app[K.ENV]
    zone = host_zone(env)
    scheduling = Scheduling(app[K.CONVERSATIONS], app[K.COMMANDS], settings, clock=app[K.CLOCK], host_zone=zone)
    scheduling.archive_step = crash_step(env)
    deliverer = app.get(DELIVERY)
    if deliverer is not None:

        async def deliver(url: str, payload: dict[str, Any]) -> bool:
            assert deliverer is not None
            return await deliverer.deliver(url, payload, timeout=DELIVERY_TIMEOUT_S)

        scheduling.deliver = deliver
    reset_zone = ZoneInfo(settings.session.reset.timezone) if settings.session.reset.timezone else zone
    service = SchedulerService(
        timezone=reset_zone,
        daily_reset=DailyJob(
            settings.session.reset.at_hour, scheduling.sweep_job, daily_boundaries(settings.session, host_zone=zone)
        ),
        sweep_seconds=settings.scheduler.sweep_seconds,
        sweep=scheduling.sweep_job,
        cleanup_at_hour=settings.cleanup.at_hour,
        cleanup=scheduling.cleanup_job,
        cron_jobs=settings.cron.jobs,
        run_cron=scheduling.run_cron,
        clock=app[K.CLOCK],
    )
    app[SCHEDULING] = scheduling
    scheduling.forget_runs = app[K.EXTRAS].get("history_forget")
    app[SCHEDULER] = service
    _serve_archives(app)
    await service.start()
    scheduling.start()
    app[K.READY]["scheduler"] = True
    try:
        yield
    finally:
        app[K.READY]["scheduler"] = False
        await scheduling.close(timeout=settings.gateway.shutdown_timeout_s / 4)
        await service.stop()


def _serve_archives(app: web.Application) -> None:
    """Archived runs stay readable through /v1/runs/{uuid}/... and for inheritance."""
    store = app[K.STORE]

    async def records(run_id: str, name: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(archive.read_records, store.home.archive_file(run_id), run_id, name)

    async def text(run_id: str, name: str) -> str | None:
        return await asyncio.to_thread(archive.read_member, store.home.archive_file(run_id), run_id, name)

    app[K.EXTRAS]["archive_reader"] = records
    app[K.EXTRAS]["archive_text_reader"] = text
    app[K.CONVERSATIONS].archive_text = text
