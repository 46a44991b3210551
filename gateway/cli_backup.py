"""``neotask backup [-o FILE]``, ``neotask backup verify FILE``, ``neotask restore FILE --home DIR``.

A backup goes through the running daemon's API (``POST /v1/admin/backup``) when one runs, else
the CLI takes the home lock and backs the files up itself. Verify and restore work on the
archive alone (no daemon involved): restore refuses a home that is not empty and leaves nothing
behind when it fails. On ``storage.backend: postgres`` the backup is a snapshot of the database in
the same format (the store's ``Backup``, ``sessions.postgres.backup``); ``restore --to
postgres://…`` copies the restored home into an empty database and verifies it
(``sessions.copying``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from config.clock import iso, system_clock
from gateway import exits, offline

if TYPE_CHECKING:
    from gateway.cli_context import Context

BACKUP_TIMEOUT_S = 3600.0


def add_commands(commands: Any, both: Sequence[argparse.ArgumentParser]) -> None:
    backup = commands.add_parser("backup", parents=both, help="back the home up into one archive (or verify one)")
    backup.add_argument("-o", "--output", default=None, metavar="FILE",
                        help="the archive to write (default <home>/backups/neotask-<time>.tar.gz)")  # fmt: skip
    backup.set_defaults(handler=cmd_backup)
    actions = backup.add_subparsers(dest="action", metavar="ACTION")
    verify = actions.add_parser("verify", parents=both, help="check an archive against its manifest")
    verify.add_argument("file")
    verify.set_defaults(handler=cmd_backup_verify)
    restore = commands.add_parser("restore", parents=both, help="restore a backup into a new or empty --home")
    restore.add_argument("file")
    restore.add_argument("--to", default=None, metavar="DSN",
                         help="then copy the sessions into this empty postgres:// database, verified")  # fmt: skip
    restore.set_defaults(handler=cmd_restore)


def cmd_backup(ctx: Context) -> int:
    output = Path(ctx.args.output).expanduser().absolute() if ctx.args.output else None
    client = ctx.client()
    if client is not None:
        client.timeout_s = BACKUP_TIMEOUT_S
        summary: Mapping[str, Any] = client.post("/v1/admin/backup", {"output": str(output) if output else None})
    else:
        from gateway.backups import take_offline

        config = ctx.config
        with offline.progress("backing up"):
            summary = offline.locked(config, lambda: take_offline(config, output, system_clock, ctx.env))
    if ctx.as_json:
        ctx.print_json(summary)
        return exits.OK
    counts = summary["counts"]
    ctx.print(f"backup written: {summary['path']} ({summary['size']} bytes, {summary['mode']})")
    ctx.print(
        f"  {counts['runs']} runs ({counts['active_runs']} active, up to their seq at {summary['point']['at']}),"
        f" {counts['archives']} archives, {counts['files']} files"
    )
    for note in summary.get("notes", {}).get("skipped", []):
        print(f"warning: {note}", file=sys.stderr)
    for name in summary.get("pruned", []):
        ctx.print(f"  pruned {name} (backup.keep)")
    return exits.OK


def cmd_backup_verify(ctx: Context) -> int:
    from backups.manifest import verify

    manifest = verify(Path(ctx.args.file).expanduser())
    if ctx.as_json:
        ctx.print_json({"ok": True, **{k: v for k, v in manifest.items() if k != "files"}})
        return exits.OK
    counts = manifest["counts"]
    ctx.print(
        f"OK: {ctx.args.file}: neotask {manifest.get('neotask_version')} backup of {manifest.get('created_at')},"
        f" {counts['files']} files checked, {counts['runs']} runs"
    )
    return exits.OK


def cmd_restore(ctx: Context) -> int:
    from backups.pack import restore
    from config.settings import Settings

    target = ctx.home
    database = None
    if ctx.args.to is not None:
        from sessions.copying import CopyRefused, PostgresEnd, parse_target

        end = parse_target(ctx.args.to) if ctx.args.to.startswith(("postgres://", "postgresql://")) else None
        if not isinstance(end, PostgresEnd):
            print(f"error: --to {ctx.args.to!r}: give a postgres://user@host:port/db DSN", file=sys.stderr)
            return exits.USAGE
        database = end
    manifest = restore(Path(ctx.args.file).expanduser(), target, now=iso(system_clock()), settings=Settings())
    copied = None
    if database is not None:
        import asyncio

        from sessions.copying import FilesEnd, copy

        try:
            copied = asyncio.run(copy(FilesEnd(target), database)).report()
        except CopyRefused as exc:
            print(f"error: restored into {target}, but not copied into the database: {exc}", file=sys.stderr)
            return exits.FAILED
    if ctx.as_json:
        body = {"ok": True, "home": str(target), **{k: v for k, v in manifest.items() if k != "files"}}
        ctx.print_json(body | ({"copied_to": database.describe(), "copy": copied} if database is not None else {}))
        return exits.OK
    ctx.print(f"restored {len(manifest['files'])} files into {target} (backup of {manifest.get('created_at')})")
    if database is not None and copied is not None:
        ctx.print(f"  copied {len(copied['runs'])} runs into {database.describe()}; verified (counts and checksums)")
        ctx.print(f"  start it with: neotask gateway --home {target} (storage.postgres.dsn naming that database)")
    elif manifest.get("backend") == "postgres":
        ctx.print("  a backup of a postgres deployment, restored as a files home: its config.yaml still says"
                  " storage.backend: postgres; start with NEOTASK_STORAGE__BACKEND=files, or restore again with"
                  " --to postgres://… into an empty database")  # fmt: skip
    else:
        ctx.print("  history index rebuilt; start it with: neotask gateway --home " + str(target))
    return exits.OK
