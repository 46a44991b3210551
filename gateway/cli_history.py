"""``neotask history search``, ``neotask sessions export`` and ``neotask sessions purge``, and the
history index's part of ``neotask doctor``: through the running daemon's API when there is one,
otherwise on the files under the home lock."""

from __future__ import annotations

import argparse
import asyncio
import html
import http.client
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlencode

from config.errors import BadRequest
from config.loader import LoadedConfig
from gateway import exits, offline
from gateway.client import GatewayClient, Unreachable, _api_error, key_segment
from gateway.tables import table as _table
from home.targets import replace_problem
from sessions.export_lines import ExportFormat, export_lines
from sessions.history_index import HistoryQuery, time_bound
from sessions.history_text import match_expression
from sessions.keys import parse_key
from sessions.protocol import StoreProtocol

if TYPE_CHECKING:
    from gateway.cli_context import Context

_MARK = re.compile(r"</?mark>")


def add_commands(commands: Any, both: Sequence[argparse.ArgumentParser], sessions_actions: Any) -> None:
    export = sessions_actions.add_parser("export", parents=both, help="every run of a key as JSON Lines or Markdown")
    export.add_argument("key")
    export.add_argument("--format", choices=("jsonl", "md"), default="jsonl")
    export.add_argument("-o", "--output", default=None, help="write to this file (default: standard output)")
    export.set_defaults(handler=cmd_sessions_export)
    purge = sessions_actions.add_parser("purge", parents=both, help="erase a key for good (runs, archives, index)")
    purge.add_argument("key")
    purge.set_defaults(handler=cmd_sessions_purge)

    history = commands.add_parser("history", help="search every transcript")
    actions = history.add_subparsers(dest="action", required=True, metavar="ACTION")
    search = actions.add_parser("search", parents=both, help="full-text search over every message")
    search.add_argument("query", nargs="+")
    search.add_argument("--agent", default=None)
    search.add_argument("--key", default=None)
    search.add_argument("--role", choices=("user", "assistant", "tool", "system"), default=None)
    search.add_argument("--since", default=None, help="ISO 8601 time")
    search.add_argument("--until", default=None, help="ISO 8601 time")
    search.add_argument("--limit", type=int, default=20)
    search.set_defaults(handler=cmd_history_search)


# -- search ----------------------------------------------------------------------------------------


def _offline_search(config: LoadedConfig, query: HistoryQuery) -> dict[str, Any]:
    async def work(store: StoreProtocol) -> dict[str, Any]:
        history = store.open_history()
        if await history.open():
            await store.rebuild_history(history)
        try:
            hits = await history.search(query)
        finally:
            await history.close()
        return {"query": query.q, "results": [h.as_dict() for h in hits], "next_cursor": None}

    return offline.with_store(config, work)


def cmd_history_search(ctx: Context) -> int:
    args = ctx.args
    q = " ".join(args.query)
    if match_expression(q) is None:
        raise BadRequest("the query has no word to search for", field="q")
    client = ctx.client()
    if client is not None:
        body = client.get("/v1/history/search", q=q, agent=args.agent, key=args.key, role=args.role,
                          since=args.since, until=args.until, limit=args.limit)  # fmt: skip
    else:
        config = ctx.config
        key = parse_key(args.key, agents=config.settings.agents).raw if args.key else None
        if args.agent is not None and args.agent not in config.settings.agents:
            raise BadRequest(f"agent {args.agent!r} is not configured", field="agent")
        since, until = time_bound("since", args.since), time_bound("until", args.until)
        query = HistoryQuery(q=q, agent=args.agent, key=key, role=args.role, since=since, until=until,
                             limit=max(1, min(args.limit, config.settings.history.max_limit)))  # fmt: skip
        body = _offline_search(config, query)
    if ctx.as_json:
        ctx.print_json(body)
        return 0
    results = body.get("results", [])
    if not results:
        ctx.print("no matches")
        return 0
    rows = [
        (r["session_key"], r["run_id"], str(r["seq"]), r["role"] + (" (tool)" if r.get("tool_result") else ""),
         (r.get("timestamp") or "")[:19], plain_snippet(r["snippet"]))
        for r in results
    ]  # fmt: skip
    ctx.print(_table(("KEY", "RUN", "SEQ", "ROLE", "TIME", "SNIPPET"), rows))
    return 0


def plain_snippet(snippet: str) -> str:
    """The API's snippet for a terminal: matches in [brackets], entities decoded."""
    return html.unescape(_MARK.sub(lambda m: "]" if m.group(0) == "</mark>" else "[", snippet))


# -- export ----------------------------------------------------------------------------------------


def _stream_online(client: GatewayClient, path: str, fmt: str, out: TextIO | Any) -> None:
    """The export from the gateway into ``out``; an error writing ``out`` (a closed pipe, a full
    disk) is raised as it is, not taken for an unreachable gateway."""
    url = f"{client.base_url}{path}?{urlencode({'format': fmt})}"
    headers = {"Authorization": f"Bearer {client.token}"} if client.token else {}
    request = urllib.request.Request(url, headers=headers, method="GET")
    try:
        response = urllib.request.urlopen(request, timeout=client.timeout_s)
    except urllib.error.HTTPError as exc:
        with exc:
            raise _api_error(exc.code, exc.read(), exc.reason) from None
    except (urllib.error.URLError, OSError) as exc:
        raise Unreachable(f"cannot reach the gateway at {client.base_url}: {getattr(exc, 'reason', exc)}") from None
    with response:
        while True:
            try:
                chunk = response.read(65536)
            except (OSError, http.client.HTTPException) as exc:  # IncompleteRead: the answer was cut off
                raise Unreachable(f"the gateway at {client.base_url} stopped in the middle: {exc!r}") from None
            if not chunk:
                return
            out.write(chunk)


def _offline_export(config: LoadedConfig, key: str, fmt: ExportFormat, out: Any) -> None:
    async def work(store: StoreProtocol) -> None:
        runs = await store.export_runs(key=key)

        def write() -> None:
            for line in export_lines(runs, fmt, title=f"Session {key}"):
                out.write(line.encode("utf-8"))

        await asyncio.to_thread(write)

    offline.with_store(config, work)


class _WriteFailed(Exception):
    """Writing the export's file failed (not reading the home or the gateway)."""


class _FileOut:
    """``-o``'s temporary file; its write errors become ``_WriteFailed``."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def write(self, data: bytes) -> None:
        try:
            self.raw.write(data)
        except OSError as exc:
            raise _WriteFailed(exc.strerror or str(exc)) from exc

    def flush(self) -> None:
        try:
            self.raw.flush()
            os.fsync(self.raw.fileno())
        except OSError as exc:
            raise _WriteFailed(exc.strerror or str(exc)) from exc


def cmd_sessions_export(ctx: Context) -> int:
    """The key's runs to stdout, or to ``-o FILE``: written beside FILE under a temporary name and
    renamed over it once whole, so a failed export (a mistyped key, a lost gateway) leaves FILE as
    it was (it used to truncate it first and delete it on the error). A folder, a device, FIFO or
    socket, and a symbolic link (the rename would replace the link, e.g. /dev/stdout) are refused."""
    args = ctx.args
    key = parse_key(args.key, agents=ctx.config.settings.agents).raw
    target = Path(args.output) if args.output else None
    if target is None:
        _export(ctx, key, sys.stdout.buffer)
        return 0
    try:
        if problem := replace_problem(target):
            raise OSError(22, problem)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        raw = tmp.open("xb")
    except OSError as exc:
        print(
            f"error: cannot write {target}: {exc.strerror or exc}; choose another -o, or leave it out for stdout",
            file=sys.stderr,
        )
        return exits.FAILED
    try:
        with raw:
            _export(ctx, key, _FileOut(raw))
        os.replace(tmp, target)
    except _WriteFailed as exc:
        return _export_failed(tmp, f"cannot write {target}: {exc}; choose another -o")
    except OSError as exc:  # the rename, or reading the home (offline)
        return _export_failed(tmp, f"the export to {target} failed: {exc.strerror or exc}")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    print(f"exported {key} to {target}", file=sys.stderr)
    return 0


def _export_failed(tmp: Path, message: str) -> int:
    tmp.unlink(missing_ok=True)
    print(f"error: {message}", file=sys.stderr)
    return exits.FAILED


def _export(ctx: Context, key: str, out: Any) -> None:
    client = ctx.client()
    if client is not None:
        _stream_online(client, f"/v1/sessions/{key_segment(key)}/export", ctx.args.format, out)
    else:
        _offline_export(ctx.config, key, "md" if ctx.args.format == "md" else "jsonl", out)
    out.flush()


# -- purge -----------------------------------------------------------------------------------------


def _offline_purge(config: LoadedConfig, key: str) -> dict[str, Any]:
    async def work(store: StoreProtocol) -> dict[str, Any]:
        history = None
        if config.settings.history.enabled:
            history = store.open_history()
            await history.open()
        try:
            tombstone = await store.purge(key, history=history)
        finally:
            if history is not None:
                await history.close()
        return {"session_key": key, "deleted": True, "purged": True, "tombstone": tombstone}

    return offline.with_store(config, work)


def cmd_sessions_purge(ctx: Context) -> int:
    key = parse_key(ctx.args.key, agents=ctx.config.settings.agents).raw
    client = ctx.client()
    if client is not None:
        body = client.request("DELETE", f"/v1/sessions/{key_segment(key)}", query={"purge": "true"})
    else:
        body = _offline_purge(ctx.config, key)
    if ctx.as_json:
        ctx.print_json(body)
    else:
        stone = body["tombstone"]
        ctx.print(f"purged {key}: {stone['runs']} run(s), {stone['messages']} message(s); tombstone kept")
    return 0
