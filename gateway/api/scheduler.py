"""Scheduled jobs and cleanup: ``GET /v1/scheduler/jobs``, run a job now, ``POST /v1/admin/cleanup``."""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from config.clock import iso
from config.errors import JobNotFound, JobRunning, PayloadTooLarge
from gateway import keys as K
from gateway import operations
from gateway.contract import NULLABLE_STR, STR, Answer, operation
from gateway.http import json_response, parse_body, read_body
from gateway.keys import SCHEDULER, SCHEDULING

routes = web.RouteTableDef()

NULLABLE_INT = {"type": ["integer", "null"]}
JOB_RUN = Answer(
    "JobRun",
    {
        "type": "object",
        "required": ["job_id", "ran", "at", "ok"],
        "properties": {
            "job_id": STR,
            "ran": {"type": "boolean"},
            "at": STR,
            "ok": {"type": "boolean", "description": "false: the turn failed or the delivery did not arrive"},
            "status": {"enum": ["answered", "stored", "failed"], "description": "cron jobs only"},
            "error": NULLABLE_STR,
            "session_key": STR,
            "run_id": NULLABLE_STR,
            "message_seq": NULLABLE_INT,
            "reply": {"type": ["object", "null"]},
            "delivery": {
                "type": ["object", "null"],
                "properties": {
                    "url": STR,
                    "delivered": {"type": "boolean"},
                    "attempts": {"type": "integer"},
                    "error": NULLABLE_STR,
                },
            },
        },
    },
)


class CleanupBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dry_run: bool = False


@routes.get("/v1/scheduler/jobs")
@operation("Scheduled jobs and their next run times", "scheduler")
async def list_jobs(request: web.Request) -> web.Response:
    return json_response({"jobs": [job.as_json() for job in request.app[SCHEDULER].jobs()]})


@routes.post("/v1/scheduler/jobs/{job_id}/run")
@operation(
    "Run a job now",
    "scheduler",
    "Answers what the job did (a cron job: answered, stored or failed and why, and its delivery).",
    answer=JOB_RUN,
    errors=(JobNotFound, JobRunning, PayloadTooLarge),
)
async def run_job(request: web.Request) -> web.Response:
    await read_body(request, request.app[K.CONFIG].settings.gateway.max_body_bytes)
    at = iso(request.app[K.CLOCK]())
    return json_response(await operations.run_job(request.app[SCHEDULER], request.match_info["job_id"], at=at))


@routes.post("/v1/admin/cleanup")
@operation("Cleanup (answers the actions)", "admin", body=CleanupBody, body_required=False)
async def cleanup(request: web.Request) -> web.Response:
    limit = request.app[K.CONFIG].settings.gateway.max_body_bytes
    body = await parse_body(request, CleanupBody, limit, optional=True)
    actions = await request.app[SCHEDULING].cleanup(dry_run=body.dry_run)
    return json_response({"dry_run": body.dry_run, "actions": actions})
