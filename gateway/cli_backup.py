"""``neotask backup [-o FILE]``, ``neotask backup verify FILE``, ``neotask restore FILE --home DIR``.

A backup goes through the running daemon's API (``POST /v1/admin/backup``) when one runs, else
the CLI takes the home lock and backs the files up itself. Verify and restore work on the
archive alone (no daemon involved): restore refuses a home that is not empty and leaves nothing
behind when it fails.
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
    from gateway.cli import Context

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
            summary = offline.locked(config, lambda: take_offline(config, output, system_clock))
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
    manifest = restore(Path(ctx.args.file).expanduser(), target, now=iso(system_clock()), settings=Settings())
    if ctx.as_json:
        ctx.print_json({"ok": True, "home": str(target), **{k: v for k, v in manifest.items() if k != "files"}})
        return exits.OK
    ctx.print(f"restored {len(manifest['files'])} files into {target} (backup of {manifest.get('created_at')})")
    ctx.print("  history index rebuilt; start it with: neotask gateway --home " + str(target))
    return exits.OK
