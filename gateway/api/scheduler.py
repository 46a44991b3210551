"""Scheduled jobs and cleanup: ``GET /v1/scheduler/jobs``, run a job now, ``POST /v1/admin/cleanup``."""

from __future__ import annotations

from aiohttp import web

from config.clock import iso
from config.errors import JobNotFound, JobRunning, PayloadTooLarge
from gateway import keys as K
from gateway import operations
from gateway.contract import NULLABLE_STR, STR, Answer, operation
from gateway.http import Strict, json_response, parse_body, read_body
from gateway.keys import SCHEDULER, SCHEDULING

routes = web.RouteTableDef()

NULLABLE_INT = {"type": ["integer", "null"]}
DELIVERY = {
    "type": ["object", "null"],
    "description": "a cron job's deliver_to: how the POST of the answer went",
    "properties": {
        "url": STR,
        "delivered": {"type": "boolean"},
        "attempts": {"type": "integer"},
        "error": {**NULLABLE_STR, "description": "why it did not arrive (the last attempt's answer or error)"},
    },
}
FIRING = {
    "type": "object",
    "required": ["started_at", "finished_at", "ok", "status", "error", "delivery"],
    "properties": {
        "started_at": STR,
        "finished_at": STR,
        "ok": {"type": "boolean", "description": "false: the job failed, or its delivery did not arrive"},
        "status": NULLABLE_STR,
        "error": {**NULLABLE_STR, "description": "why the job failed (a delivery's reason is in `delivery`)"},
        "delivery": DELIVERY,
    },
}
JOBS = Answer(
    "Jobs",
    {
        "type": "object",
        "required": ["jobs"],
        "properties": {
            "jobs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "kind", "trigger", "next_run_at", "running", "last_runs"],
                    "properties": {
                        "id": STR,
                        "kind": STR,
                        "trigger": STR,
                        "next_run_at": NULLABLE_STR,
                        "running": {"type": "boolean"},
                        "last_run_at": NULLABLE_STR,
                        "skipped": {"type": "integer"},
                        "last_runs": {
                            "type": "array",
                            "items": FIRING,
                            "description": "this process's last firings since its start, newest first",
                        },
                    },
                },
            }
        },
    },
)
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
            "delivery": DELIVERY,
        },
    },
)


class CleanupBody(Strict):
    dry_run: bool = False


@routes.get("/v1/scheduler/jobs")
@operation(
    "Scheduled jobs and their next run times",
    "scheduler",
    "Each job with its trigger, next run and last firings (outcome, why a firing failed, and a cron"
    " job's delivery with the reason it did not arrive).",
    answer=JOBS,
)
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
