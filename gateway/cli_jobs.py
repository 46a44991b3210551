"""``neotask memory``, ``neotask cron`` and ``neotask sessions cleanup``: through the running
daemon's API when there is one, otherwise on the files under the home lock."""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from config.clock import host_zone, iso, system_clock
from config.errors import BadRequest
from gateway import offline
from gateway.client import ApiError, GatewayClient, Unreachable, key_segment
from gateway.tables import table as _table

if TYPE_CHECKING:
    from gateway.cli_context import Context

REINDEX_TIMEOUT_S = 3600.0  # a forced reindex of a large memory takes a while; the bar shows it moving
PROGRESS_POLL_S = 0.2


def add_commands(commands: Any, both: Sequence[argparse.ArgumentParser], sessions_actions: Any) -> None:
    cleanup = sessions_actions.add_parser("cleanup", parents=both, help="archive old runs (SPEC section 7)")
    cleanup.add_argument("--dry-run", action="store_true", help="print what would happen, change nothing")
    cleanup.set_defaults(handler=cmd_cleanup)

    memory = commands.add_parser("memory", help="the long-term memory index")
    actions = memory.add_subparsers(dest="action", required=True, metavar="ACTION")
    index = actions.add_parser("index", parents=both, help="bring the index level with the files now")
    index.add_argument("--force", action="store_true", help="re-embed everything into a new table")
    index.add_argument("--agent", default=None)
    index.set_defaults(handler=cmd_memory_index)
    search = actions.add_parser("search", parents=both, help="hybrid search")
    search.add_argument("query", nargs="+")
    search.add_argument("--agent", default="main")
    search.add_argument("-k", type=int, default=None)
    search.set_defaults(handler=cmd_memory_search)
    actions.add_parser("status", parents=both, help="files, chunks, identity, last run").set_defaults(
        handler=cmd_memory_status
    )

    cron = commands.add_parser("cron", help="scheduled jobs")
    cron_actions = cron.add_subparsers(dest="action", required=True, metavar="ACTION")
    cron_actions.add_parser("list", parents=both, help="jobs and their next run times").set_defaults(
        handler=cmd_cron_list
    )
    run = cron_actions.add_parser("run", parents=both, help="run a job now")
    run.add_argument("job_id")
    run.set_defaults(handler=cmd_cron_run)


# -- cleanup ---------------------------------------------------------------------------------------


def cmd_cleanup(ctx: Context) -> int:
    dry_run = bool(ctx.args.dry_run)
    client = ctx.client()
    if client is not None:
        body = client.post("/v1/admin/cleanup", {"dry_run": dry_run})
    else:
        body = {"dry_run": dry_run, "actions": offline.with_services(ctx.config, ctx.env, _offline_cleanup(dry_run))}
    if ctx.as_json:
        ctx.print_json(body)
        return 0
    actions = body["actions"]
    if not actions:
        ctx.print("nothing to clean up")
        return 0
    header = ("ACTION", "RUN", "SESSION", "REASON", "DONE")
    rows = [(a["action"], a["run_id"], a.get("session_key") or "-", a["reason"], "yes" if a["done"] else "no")
            for a in actions]  # fmt: skip
    ctx.print(_table(header, rows))
    ctx.print(f"{len(actions)} action(s)" + (" (dry run: nothing changed)" if dry_run else ""))
    return 0


def _offline_cleanup(dry_run: bool) -> Any:
    async def work(services: Any) -> list[dict[str, Any]]:  # as POST /v1/admin/cleanup does
        actions: list[dict[str, Any]] = await services.scheduling.cleanup(dry_run=dry_run)
        return actions

    return work


# -- memory ----------------------------------------------------------------------------------------


def _with_memory(ctx: Context, work: Callable[[Any], Any]) -> Any:
    from gateway.services import memory_service

    config = ctx.config

    async def run() -> Any:
        service = memory_service(config, ctx.env, system_clock, background=False)  # no watcher: one command's work
        await service.start()
        try:
            return await work(service)
        finally:
            await service.close()

    return offline.locked(config, lambda: asyncio.run(run()))


def cmd_memory_index(ctx: Context) -> int:
    client = ctx.client()
    if client is not None:
        body = _reindex_online(client, {"agent": ctx.args.agent, "force": bool(ctx.args.force)})
    else:

        async def work(service: Any) -> dict[str, Any]:
            report = await service.reindex(ctx.args.agent, force=bool(ctx.args.force), progress=_ProgressBar())
            sys.stderr.write("\n")
            return {"report": report.as_dict(), "status": service.status()}

        body = _with_memory(ctx, work)
    if ctx.as_json:
        ctx.print_json(body)
    else:
        report = body["report"]
        ctx.print(
            f"indexed: {report['files_scanned']} file(s) scanned, {report['files_changed']} changed,"
            f" {report['chunks_embedded']} chunk(s) embedded, {report['chunks_reused']} reused,"
            f" {report['chunks_deleted']} deleted in {report['seconds']:.1f} s"
        )
        for error in report.get("errors", []):
            ctx.print(f"error: {error}")
    return 0


def _reindex_online(client: GatewayClient, request: dict[str, Any]) -> Any:
    """POST /v1/memory/reindex (it answers when done) while polling /v1/memory/status, whose
    ``reindex`` field the daemon keeps current, to draw the same progress bar as offline."""
    caller = GatewayClient(client.base_url, token=client.token, timeout_s=REINDEX_TIMEOUT_S)
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["body"] = caller.post("/v1/memory/reindex", request)
        except (ApiError, Unreachable) as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=call, name="reindex", daemon=True)
    worker.start()
    shown: tuple[int, int] | None = None
    bar = _ProgressBar()
    while worker.is_alive():
        worker.join(PROGRESS_POLL_S)
        if not worker.is_alive():
            break
        try:
            state = client.get("/v1/memory/status").get("reindex") or {}
        except (ApiError, Unreachable):
            continue
        if state.get("running") and isinstance(state.get("total"), int):
            current = (int(state["done"]), int(state["total"]))
            if current != shown:
                shown = current
                bar(*current)
    if "error" in outcome:
        raise outcome["error"]
    report = outcome["body"].get("report") or {}
    total = int(report.get("chunks_embedded", 0)) + int(report.get("chunks_reused", 0))
    if shown is not None or total:
        bar(total, total)
        sys.stderr.write("\n")
    return outcome["body"]


class _ProgressBar:
    """``[#####.....] 120/900 chunks, 35.2 chunks/s, 22 s left`` on stderr, redrawn in place; the
    rate is counted from the first call."""

    def __init__(self) -> None:
        self._started: float | None = None

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        self._started = now if self._started is None else self._started
        width = 30
        filled = width * done // total if total else width
        line = f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} chunks"
        elapsed = now - self._started
        if done and elapsed > 0 and done < total:
            rate = done / elapsed
            line += f", {rate:.1f} chunks/s, {(total - done) / rate:.0f} s left"
        sys.stderr.write(line + " " * 8)
        sys.stderr.flush()


def cmd_memory_search(ctx: Context) -> int:
    query = " ".join(ctx.args.query)
    if "\x00" in query:
        raise BadRequest("the query holds a NUL character: pass text only")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("the query holds bytes that are not UTF-8 text: pass UTF-8 text") from None
    client = ctx.client()
    if client is not None:
        params: dict[str, Any] = {"q": query, "agent": ctx.args.agent, "k": ctx.args.k}
        body = client.get("/v1/memory/search", **params)
    else:

        async def work(service: Any) -> dict[str, Any]:
            service.check_search(ctx.args.agent, query, ctx.args.k)  # bad input changes nothing on disk
            await service.reindex(ctx.args.agent)
            hits = await service.search(ctx.args.agent, query, k=ctx.args.k)
            from conversations.relevance import present  # memory loads only for the commands that use it

            return {"query": query, "results": [present(h) for h in hits]}

        body = _with_memory(ctx, work)
    if ctx.as_json:
        ctx.print_json(body)
        return 0
    if not body["results"]:
        ctx.print("no memory clears the thresholds for that query")
        return 0
    rows = [(f"{r['score']:.3f}", r["citation"], r["heading"] or "-", " ".join(r["snippet"].split())[:100])
            for r in body["results"]]  # fmt: skip
    ctx.print(_table(("SCORE", "CITATION", "HEADING", "SNIPPET"), rows))
    return 0


def cmd_memory_status(ctx: Context) -> int:
    client = ctx.client()
    body = client.get("/v1/memory/status") if client else _with_memory(ctx, _status)
    if ctx.as_json:
        ctx.print_json(body)
    else:
        rows = [(name, str(body.get(name))) for name in ("ready", "files", "chunks", "pending", "identity", "last_run")]
        ctx.print(_table(("FIELD", "VALUE"), rows))
    return 0


async def _status(service: Any) -> dict[str, Any]:
    status: dict[str, Any] = service.status()
    return status


# -- cron ------------------------------------------------------------------------------------------


def _service(ctx: Context) -> Any:
    """The cron jobs as the scheduler plans them (for their next run times only)."""
    from scheduler.service import SchedulerService

    settings = ctx.config.settings

    async def nothing(*_: Any) -> None:
        return None

    return SchedulerService(
        timezone=host_zone(ctx.env),
        daily_reset=None,
        sweep_seconds=settings.scheduler.sweep_seconds,
        sweep=nothing,
        cleanup_at_hour=settings.cleanup.at_hour,
        cleanup=nothing,
        cron_jobs=settings.cron.jobs,
        run_cron=nothing,
        clock=system_clock,
    )


def cmd_cron_list(ctx: Context) -> int:
    client = ctx.client()
    if client is not None:
        jobs = client.get("/v1/scheduler/jobs")["jobs"]
    else:
        jobs = [job.as_json() for job in _service(ctx).jobs() if job.kind == "cron"]
    if ctx.as_json:
        ctx.print_json({"jobs": jobs})
    elif not jobs:
        ctx.print("no scheduled jobs (add them under cron.jobs)")
    else:
        rows = [(j["id"], j["kind"], j["trigger"], j["next_run_at"] or "-") for j in jobs]
        ctx.print(_table(("JOB", "KIND", "SCHEDULE", "NEXT RUN"), rows))
    return 0


def cmd_cron_run(ctx: Context) -> int:
    """Exit 0 when the job ran (answered, or stored without a model) and delivered where it
    delivers; 1 when its turn failed or its delivery did not arrive, saying why."""
    client = ctx.client()
    job_id = ctx.args.job_id
    if client is not None:
        body = client.post(f"/v1/scheduler/jobs/{key_segment(job_id)}/run", {})
    else:
        body = offline.with_services(ctx.config, ctx.env, _offline_cron(job_id), label=f"running cron job {job_id}")
    ok = body.get("ok", True)
    if ctx.as_json:
        ctx.print_json(body)
    else:
        ctx.print(describe_run(body))
    if not ok:
        problem = body.get("error") or (body.get("delivery") or {}).get("error") or "see the gateway log"
        print(f"error: cron job {body['job_id']} failed: {problem}", file=sys.stderr)
        return 1
    return 0


def describe_run(body: dict[str, Any]) -> str:
    """One line per thing that happened: the turn (answered, stored, failed), the delivery."""
    job, status = body["job_id"], body.get("status")
    lines = [f"ran {job} at {body.get('at')}"]
    if status == "answered":
        lines.append(f"answered in run {body.get('run_id')} (message {body.get('message_seq')})")
    elif status == "stored":
        lines.append(f"stored in run {body.get('run_id')} (message {body.get('message_seq')}); no model answers")
    elif status == "failed":
        lines.append(f"failed: {body.get('error')}")
    delivery = body.get("delivery")
    if delivery:
        if delivery["delivered"]:
            lines.append(f"delivered to {delivery['url']}")
        else:
            url, attempts, error = delivery["url"], delivery["attempts"], delivery["error"]
            lines.append(f"not delivered to {url} after {attempts} attempt(s): {error}")
    return "\n".join(lines)


def _offline_cron(job_id: str) -> Any:
    async def work(services: Any) -> dict[str, Any]:  # as POST /v1/scheduler/jobs/{id}/run does
        from gateway.operations import run_job

        result: dict[str, Any] = await run_job(services.scheduler, job_id, at=iso(system_clock()))
        return result

    return work
