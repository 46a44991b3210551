"""The ``neotask`` command (SPEC section 10).

When a daemon runs on the home (``gateway.json`` present and the lock held) the CLI calls its
HTTP API; otherwise it takes the lock itself and works on the files (``gateway.offline``).
Readable tables by default (full run ids), ``--json`` prints the API's JSON. Exit status
(``gateway/exits.py``): 0 on success, 1 when the work failed (``error: <code>: <message>``), 2 on
bad usage, 3 from ``gateway status`` when no gateway runs, 4 on an invalid configuration (from the
daemon and ``config check`` alike), 73 when a second daemon is refused, 78 when the home's state
must be fixed first (``error: <file>: <problem>: <what to do>``; also ``doctor`` when it leaves
errors unfixed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from config.errors import ConfigError, DatabaseRefused, NeotaskError
from gateway import (
    cli_admin,
    cli_backup,
    cli_channels,
    cli_history,
    cli_init,
    cli_jobs,
    cli_service,
    cli_storage,
    exits,
    offline,
)
from gateway.cli_context import START_WAIT_S, Context
from gateway.client import ApiError, GatewayClient, Unreachable, key_segment
from gateway.places import version
from gateway.tables import table as _table
from home.damage import EXIT_STATE, DamagedState
from home.layout import PRIVATE_UMASK
from home.lock import EXIT_LOCKED, HomeLock, HomeLocked, is_locked
from sessions.records import CHAT_TYPES, ENTRY_STATUSES

EXIT_OK = exits.OK
EXIT_ERROR = exits.FAILED
EXIT_USAGE = exits.USAGE
EXIT_NOT_RUNNING = exits.NOT_RUNNING
EXIT_CONFIG = exits.CONFIG
EXIT_BROKEN_PIPE = exits.BROKEN_PIPE  # as a shell reports a tool that SIGPIPE ended (`neotask ... --json | head`)
STOP_WAIT_S = 15.0


Handler = Callable[[Context], int]


# -- the parser ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    # SUPPRESS: a subcommand's default must not overwrite a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", default=argparse.SUPPRESS, help="the home (default NEOTASK_HOME or ~/.neotask)")
    common.add_argument("--config", default=argparse.SUPPRESS, help="config file (default <home>/config.yaml)")
    api = argparse.ArgumentParser(add_help=False)
    api.add_argument("--token", default=argparse.SUPPRESS, help="bearer token (default NEOTASK_TOKEN, config)")
    api.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    api.add_argument("--wait-start", type=float, default=argparse.SUPPRESS, metavar="SECONDS",
                     help=f"wait this long for a gateway that is starting (default {START_WAIT_S:g})")  # fmt: skip
    both = [common, api]

    parser = argparse.ArgumentParser(prog="neotask", description="Neotask gateway for LLM agents")
    parser.add_argument("--version", action="version", version=f"neotask {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cli_init.add_commands(commands, common)

    gateway = commands.add_parser("gateway", parents=[common], help="run the gateway, or status|stop")
    gateway.add_argument("--host", default=None, help="listen address (default gateway.host)")
    gateway.add_argument("--port", type=int, default=None, help="listen port, 0 = any free port")
    gateway.add_argument("--workers", type=int, default=None, metavar="N",
                         help="processes on the port (default gateway.workers; above 1: postgres only)")  # fmt: skip
    gateway.set_defaults(handler=cmd_gateway_run)
    gateway_actions = gateway.add_subparsers(dest="action", metavar="ACTION")
    gateway_actions.add_parser("status", parents=both, help="is a gateway running here").set_defaults(
        handler=cmd_gateway_status
    )
    gateway_actions.add_parser("stop", parents=both, help="stop the running gateway (SIGTERM)").set_defaults(
        handler=cmd_gateway_stop
    )
    cli_service.add_commands(commands, common)

    sessions = commands.add_parser("sessions", help="list and manage sessions")
    actions = sessions.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", parents=both, help="sessions, newest activity first")
    listing.add_argument("--agent")
    listing.add_argument("--type", choices=CHAT_TYPES)
    listing.add_argument("--status", choices=ENTRY_STATUSES)
    listing.add_argument("--limit", type=int, default=50, help="page size, 1 to 500 (default 50)")
    listing.add_argument("--cursor", default=None, help="the next page: the cursor a previous page printed")
    listing.add_argument("--all", action="store_true", help="every session (follows the cursor page by page)")
    listing.set_defaults(handler=cmd_sessions_list)
    for name, handler, text in (
        ("show", cmd_sessions_show, "one session"),
        ("reset", cmd_sessions_reset, "complete the active run; the next one inherits its summary"),
        ("delete", cmd_sessions_delete, "complete the active run and remove the session"),
    ):
        sub = actions.add_parser(name, parents=both, help=text)
        sub.add_argument("key")
        sub.set_defaults(handler=handler)
    compact = actions.add_parser("compact", parents=both, help="compact the context now (/compact)")
    compact.add_argument("key")
    compact.add_argument("instructions", nargs="*", help="what the summary should focus on")
    compact.set_defaults(handler=cmd_sessions_compact)
    cli_jobs.add_commands(commands, both, actions)
    cli_history.add_commands(commands, both, actions)

    cli_admin.add_commands(commands, both)
    cli_channels.add_commands(commands, both)
    cli_backup.add_commands(commands, both)
    cli_storage.add_commands(commands, both)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.umask(PRIVATE_UMASK)  # every file and folder of the home is created private to the owner
    ctx = Context(args, dict(os.environ))
    handler: Handler = args.handler
    try:
        status = handler(ctx)
        sys.stdout.flush()  # here, where a closed pipe can still be caught, not at interpreter exit
        return status
    except BrokenPipeError:
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except ApiError as exc:
        return _fail(f"{exc.code}: {exc.message}")
    except Unreachable as exc:
        return _fail(str(exc))
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    except (DamagedState, DatabaseRefused) as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_STATE
    except NeotaskError as exc:
        return _fail(f"{exc.code}: {exc.message}")
    except KeyboardInterrupt:
        return exits.INTERRUPTED


def _drop_stdout() -> None:
    """The reader went away: point stdout at /dev/null so the final flush has nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


# -- gateway ---------------------------------------------------------------------------------------


def cmd_gateway_run(ctx: Context) -> int:
    """Take the lock before loading anything, so a second daemon is refused at once (a worker of
    ``--workers N`` takes none: its supervisor holds it)."""
    from gateway.workers import WORKER_ENV, refusal

    if ctx.env.get(WORKER_ENV):
        from gateway.daemon import run_daemon

        return run_daemon(ctx.config, host=ctx.args.host, port=ctx.args.port, env=ctx.env)
    if ctx.args.workers is not None and ctx.args.workers < 1:
        print(f"error: --workers must be 1 or more, not {ctx.args.workers}", file=sys.stderr)
        return EXIT_USAGE
    lock = HomeLock(ctx.home / "gateway.lock")
    try:
        lock.acquire()
    except HomeLocked as exc:
        print(exc.message, file=sys.stderr)
        return EXIT_LOCKED
    except DamagedState as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_STATE
    from gateway.validation import check_config

    try:  # what ``config check`` checks, before anything is built
        config = ctx.config
        check_config(config, ctx.env)
    except ConfigError as exc:
        lock.release()
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    workers = ctx.args.workers or config.settings.gateway.workers
    refused = refusal(config.settings.storage.backend, workers)
    if refused is not None:  # before anything opens
        lock.release()
        print(f"error: {refused}", file=sys.stderr)
        return EXIT_CONFIG
    from gateway.daemon import run_daemon  # the app (and the model client) load only for the daemon

    return run_daemon(config, host=ctx.args.host, port=ctx.args.port, env=ctx.env, lock=lock, workers=workers)


def cmd_gateway_status(ctx: Context) -> int:
    info = ctx.gateway_info()
    if info is None:
        if ctx.as_json:
            ctx.print_json({"running": False, "home": str(ctx.home)})
        else:
            ctx.print(f"gateway not running (home {ctx.home})")
        return EXIT_NOT_RUNNING
    client = GatewayClient(str(info.get("url")), timeout_s=5)
    try:
        client.get("/healthz")
        healthy = True
    except (ApiError, Unreachable):
        healthy = False
    try:
        ready = client.get("/readyz")
    except ApiError as exc:
        ready = {"ready": False, "error": exc.message}
    except Unreachable:
        ready = {"ready": False}
    status = {"running": True, **info, "healthy": healthy, "ready": ready}
    if ctx.as_json:
        ctx.print_json(status)
        return EXIT_OK
    rows = [(name, str(info.get(name, "-"))) for name in ("pid", "url", "started_at", "home", "version")]
    checks = ready.get("checks") if isinstance(ready, dict) else None
    rows.append(("healthy", "yes" if healthy else "no"))
    rows.append(("ready", "yes" if isinstance(ready, dict) and ready.get("ready") else "no"))
    if isinstance(ready, dict) and "leader" in ready:  # the postgres backend: several processes
        rows.append(("leader", "yes" if ready["leader"] else "no"))
    if isinstance(checks, dict):
        rows.extend((f"  {name}", "ok" if ok else "not ready") for name, ok in checks.items())
    for worker in ready.get("workers", []) if isinstance(ready, dict) else []:  # --workers N
        said = "not answering" if not worker.get("answering") else (
            f"pid {worker.get('pid')}, {'ready' if worker.get('ready') else 'not ready'}"
            + (", leader" if worker.get("leader") else ""))  # fmt: skip
        rows.append((f"worker {worker['worker']}", said))
    ctx.print("gateway running")
    ctx.print(_pairs(rows))
    return EXIT_OK


def cmd_gateway_stop(ctx: Context) -> int:
    info = ctx.gateway_info()
    lock_file = ctx.home / "gateway.lock"
    if info is None:
        ctx.print_json({"stopped": False, "running": False}) if ctx.as_json else ctx.print("gateway not running")
        return EXIT_OK
    pid = int(info["pid"])
    try:
        holder = lock_file.read_text(encoding="utf-8").strip()
    except OSError:
        holder = ""
    if holder != str(pid):
        return _fail(f"gateway.json names pid {pid} but the lock is held by pid {holder or '?'}; not signalling")
    with contextlib.suppress(ProcessLookupError):  # it exited meanwhile: wait for the lock below
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    while is_locked(lock_file):
        if time.monotonic() > deadline:
            return _fail(f"the gateway (pid {pid}) did not stop within {STOP_WAIT_S:.0f} s")
        time.sleep(0.05)
    record = exits.read_exit(ctx.home, pid)  # written by the daemon before it let the lock go
    status = record.get("status") if record else None
    if ctx.as_json:
        ctx.print_json({"stopped": True, "pid": pid, "exit_status": status, "reason": (record or {}).get("reason")})
    if status == 0:
        if not ctx.as_json:
            ctx.print(f"gateway stopped (pid {pid})")
        return EXIT_OK
    log_file = ctx.home / "logs" / "gateway.log"
    if record is None:
        return _fail(f"the gateway (pid {pid}) stopped without recording how (killed?); see {log_file}")
    why = f": {record['reason']}" if record.get("reason") else ""
    return _fail(f"the gateway (pid {pid}) stopped with exit status {status}{why}; see {log_file}")


# -- sessions --------------------------------------------------------------------------------------


LIST_PAGE_MAX = 500  # the API's largest page (``limit``)


def _list_online(client: GatewayClient, args: argparse.Namespace) -> dict[str, Any]:
    """One page, or with ``--all`` every page (following ``next_cursor``) joined into one."""
    filters = {"agent": args.agent, "type": args.type, "status": args.status}
    limit = LIST_PAGE_MAX if args.all else args.limit
    body: dict[str, Any] = client.get("/v1/sessions", **filters, limit=limit, cursor=args.cursor)
    if not args.all:
        return body
    sessions = list(body.get("sessions", []))
    while body.get("next_cursor"):
        body = client.get("/v1/sessions", **filters, limit=limit, cursor=body["next_cursor"])
        sessions.extend(body.get("sessions", []))
    return {"sessions": sessions, "next_cursor": None}


def cmd_sessions_list(ctx: Context) -> int:
    args = ctx.args
    if args.all and args.cursor:
        print("error: --all lists from the start: leave out --cursor", file=sys.stderr)
        return EXIT_USAGE
    if not args.all and not 1 <= args.limit <= LIST_PAGE_MAX:
        print(f"error: --limit must be 1 to {LIST_PAGE_MAX}; use --all for every session", file=sys.stderr)
        return EXIT_USAGE
    client = ctx.client()
    if client is not None:
        body = _list_online(client, args)
    else:
        body = offline.list_sessions(
            ctx.config, ctx.env, agent=args.agent, chat_type=args.type, status=args.status,
            limit=None if args.all else args.limit, cursor=args.cursor,
        )  # fmt: skip
    if ctx.as_json:
        ctx.print_json(body)
        return EXIT_OK
    sessions = body.get("sessions", [])
    if not sessions:
        ctx.print("no sessions")
        return EXIT_OK
    header = ("KEY", "STATUS", "RUN", "TYPE", "AGENT", "MESSAGES", "TOKENS", "LAST ACTIVITY")
    rows = [
        (
            s["key"],
            s.get("status") or "-",
            s.get("run_id") or "-",
            s.get("chat_type") or "-",
            s.get("agent_id") or "-",
            str(s.get("message_count", 0)),
            _tokens(s),
            s.get("last_interaction_at") or "-",
        )
        for s in sessions
    ]
    ctx.print(_table(header, rows))
    if body.get("next_cursor"):
        ctx.print(f"{len(sessions)} session(s) shown; more: --cursor {body['next_cursor']} (or --all)")
    else:
        ctx.print(f"{len(sessions)} session(s)" + (" on this last page" if args.cursor else ""))
    return EXIT_OK


def cmd_sessions_show(ctx: Context) -> int:
    key = ctx.args.key
    client = ctx.client()
    body = client.get(f"/v1/sessions/{key_segment(key)}") if client else offline.show_session(ctx.config, ctx.env, key)
    if ctx.as_json:
        ctx.print_json(body)
        return EXIT_OK
    names = ("key", "status", "run_id", "last_run_id", "agent_id", "chat_type", "channel", "label", "pinned",
             "created_at", "started_at", "last_interaction_at", "message_count")  # fmt: skip
    usage = body.get("tokens") or {}
    rows = [(name, _text(body.get(name))) for name in names]
    rows += [
        ("tokens", _tokens(body)),
        ("usage", "input {} / output {} / cache read {} / cache write {}".format(
            *(usage.get(k, 0) for k in ("input", "output", "cache_read", "cache_write")))),
        *((name, _text(body.get(name))) for name in ("compactions", "next_reset", "model")),
    ]  # fmt: skip
    if body.get("settings"):
        rows.append(("settings", json.dumps(body["settings"], ensure_ascii=False)))
    ctx.print(_pairs(rows))
    return EXIT_OK


def cmd_sessions_reset(ctx: Context) -> int:
    key = ctx.args.key
    body = _command(ctx, key, "/reset")  # as /reset does: memory flush, final summary, inherit next
    completed = next((e.get("previous_run_id") for e in body.get("events", []) if e.get("type") == "reset"), None)
    if ctx.as_json:
        ctx.print_json({**body, "completed_run_id": completed, "status": "idle"})
    elif completed:
        ctx.print(f"reset {key}: completed run {completed}; the next message starts a new run")
    else:
        ctx.print(f"reset {key}: no active run; the next message starts a new run")
    return EXIT_OK


def cmd_sessions_compact(ctx: Context) -> int:
    key = ctx.args.key
    body = _command(ctx, key, " ".join(["/compact", *ctx.args.instructions]))
    if ctx.as_json:
        ctx.print_json(body)
    else:
        ctx.print((body.get("reply") or {}).get("content") or "done")
    return EXIT_OK


def _command(ctx: Context, key: str, command: str) -> Mapping[str, Any]:
    """A chat command on an existing session, through the daemon or through the same Commands offline."""
    client = ctx.client()
    if client is None:
        return offline.run_command(ctx.config, key, command, ctx.env)
    client.get(f"/v1/sessions/{key_segment(key)}")  # an unknown key is an error, not a new session
    body: dict[str, Any] = client.post(f"/v1/sessions/{key_segment(key)}/commands", {"command": command})
    return body


def cmd_sessions_delete(ctx: Context) -> int:
    key = ctx.args.key
    client = ctx.client()
    body = (
        client.delete(f"/v1/sessions/{key_segment(key)}")
        if client
        else offline.delete_session(ctx.config, ctx.env, key)
    )
    if ctx.as_json:
        ctx.print_json(body)
    else:
        completed = body.get("completed_run_id")
        ctx.print(f"deleted {key}" + (f" (completed run {completed})" if completed else ""))
    return EXIT_OK


# -- output ----------------------------------------------------------------------------------------


def _pairs(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def _tokens(session: Mapping[str, Any]) -> str:
    tokens = session.get("tokens")
    if isinstance(tokens, dict):
        return f"{tokens.get('context', 0)}/{tokens.get('threshold', '?')}"
    return str(session.get("context_tokens", 0))


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
