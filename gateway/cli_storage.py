"""``neotask storage copy --to TARGET``: copy the configured store (``--home``/``--config``) into
an empty PostgreSQL database (``postgres://…``) or a new files home (a directory), then verify it
(``sessions.copying``). Offline only: the command holds the source home's lock, so it refuses,
in one line, while a daemon (or another command) works on it. It prints each run's counts and
sha256, the count and sha256 of the usage rows and of the tombstones, and what it could not
carry (a run whose folder or archive is missing)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway import exits, offline
from home.layout import Home
from home.lock import HomeLock
from sessions.copying import CopyRefused, End, FilesEnd, Snapshot, configured_end, copy, parse_target

if TYPE_CHECKING:
    from config.loader import LoadedConfig
    from gateway.cli_context import Context


def add_commands(commands: Any, both: Sequence[argparse.ArgumentParser]) -> None:
    storage = commands.add_parser("storage", help="move the sessions between storage backends")
    actions = storage.add_subparsers(dest="action", required=True, metavar="ACTION")
    copying = actions.add_parser(
        "copy", parents=both, help="copy every run, message, summary, record and entry into an empty target"
    )
    copying.add_argument(
        "--to",
        required=True,
        metavar="TARGET",
        help="postgres://user@host:port/db (empty) or a new files home directory",
    )
    copying.set_defaults(handler=cmd_storage_copy)


def source_of(config: LoadedConfig, env: Mapping[str, str]) -> End:
    """The configured store as a copy's source."""
    return configured_end(config.settings, config.home, env)


def cmd_storage_copy(ctx: Context) -> int:
    try:
        target = parse_target(ctx.args.to)
    except CopyRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exits.USAGE
    config = ctx.config
    source = source_of(config, ctx.env)

    def work() -> Snapshot:
        if isinstance(target, FilesEnd):
            target.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            with HomeLock(Home(target.root).lock_file):  # nothing else writes the new home meanwhile
                return asyncio.run(copy(source, target))
        return asyncio.run(copy(source, target))

    try:
        with offline.progress(f"copying {source.describe()} to {target.describe()}"):
            snapshot = offline.locked(config, work)
    except CopyRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exits.FAILED
    report = snapshot.report()
    for note in report["skipped"]:
        print(f"warning: skipped {note}", file=sys.stderr)
    if ctx.as_json:
        ctx.print_json({"source": source.describe(), "target": target.describe(), **report})
        return exits.OK
    for run in report["runs"]:
        ctx.print(
            f"{run['run_id']} {run['status']}: {run['messages']} messages, {run['context']} context lines,"
            f" {run['summaries']} summaries, {run['tools']} tool calls, {run['plans']} plans,"
            f" {run['archives']} compaction archives, sha256 {run['sha256']}"
        )
    records = ", ".join(f"{count} {table}" for table, count in report["records"].items())
    ctx.print(f"usage: {report['usage']['rows']} usage rows, sha256 {report['usage']['sha256']}")
    ctx.print(f"tombstones: {report['tombstones']['count']} tombstones, sha256 {report['tombstones']['sha256']}")
    ctx.print(
        f"copied {len(report['runs'])} runs, {report['entries']} sessions and {records}"
        f" from {source.describe()} to {target.describe()}; verified (counts and checksums match)"
    )
    if report["skipped"]:
        ctx.print(f"not copied: {len(report['skipped'])} runs (see the warnings)")
    return exits.OK
