"""``neotask config check|show`` and ``neotask doctor``: through the running daemon's API when there
is one, otherwise on the files.

Exit status of ``neotask doctor``: 0 when nothing at error level is left (warnings and info
findings, or errors that ``--fix`` fixed), 78 when an error-level finding is left unfixed (each is
printed on stderr as ``error: ...``), 1 when the doctor itself could not run (``error: <code>:``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from config.errors import ConfigError, DatabaseRefused
from gateway import exits, offline
from gateway.tables import table as _table
from home.damage import EXIT_STATE

if TYPE_CHECKING:
    from gateway.cli_context import Context

EXIT_OK = exits.OK
EXIT_ERROR = exits.FAILED


def add_commands(commands: Any, both: Sequence[argparse.ArgumentParser]) -> None:
    config = commands.add_parser("config", help="check or show the configuration")
    config_actions = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = config_actions.add_parser("check", parents=both, help="validate the configuration as the daemon does")
    check.add_argument(
        "--connect", action="store_true",
        help="also log in to the database of storage.postgres once (exit 78 with the setting to fix when refused)",
    )  # fmt: skip
    check.set_defaults(handler=cmd_config_check)
    show = config_actions.add_parser(
        "show",
        parents=both,
        help="the effective configuration (a running daemon's, else the files'; tokens redacted)",
    )
    show.set_defaults(handler=cmd_config_show)
    reload = config_actions.add_parser(
        "reload", parents=both, help="have the running gateway read its config file again (as SIGHUP does)"
    )
    reload.set_defaults(handler=cmd_config_reload)

    doctor = commands.add_parser("doctor", parents=both, help="consistency checks over the home (exit 78: errors left)")
    doctor.add_argument("--fix", action="store_true", help="apply the safe fixes")
    doctor.set_defaults(handler=cmd_doctor)


# -- config ----------------------------------------------------------------------------------------


def cmd_config_check(ctx: Context) -> int:
    try:  # the file's own schema, then what the daemon checks before it builds anything
        from gateway.validation import check_config, check_listening

        config = ctx.config
        warnings = [*config.warnings, *check_config(config, ctx.env)]
        check_listening(config.settings.gateway.tokens, config.settings.gateway.host)  # as the daemon will
    except ConfigError as exc:
        return _check_failed(ctx, exc.message, exits.CONFIG)
    source = str(config.config_path) if config.config_path else "defaults only (no config file)"
    connected = None
    if ctx.args.connect:
        from sessions.backends import try_storage

        try:
            connected = asyncio.run(try_storage(config.settings, environ=ctx.env))
        except DatabaseRefused as exc:
            return _check_failed(ctx, exc.message, exits.STATE)
    if ctx.as_json:
        ctx.print_json({"ok": True, "config_path": source, "home": str(config.home), "warnings": warnings,
                        "connected": connected})  # fmt: skip
        return EXIT_OK
    ctx.print(f"OK: {source}")
    if connected:
        ctx.print(connected)
    for warning in warnings:
        ctx.print(f"warning: {warning}")
    return EXIT_OK


def _check_failed(ctx: Context, message: str, status: int) -> int:
    if ctx.as_json:
        ctx.print_json({"ok": False, "error": message})
    else:
        print(f"error: {message}", file=sys.stderr)
    return status


def cmd_config_show(ctx: Context) -> int:
    """The running gateway's effective configuration when one runs (its ``--port``, the
    environment it started with), else the files' (and this environment's); the first line (the
    ``source`` field with ``--json``) says which."""
    client = ctx.client()
    if client is not None:
        body = client.get("/v1/admin/config")
        data, source = body["settings"], body["source"]
        title = f"the running gateway's effective configuration ({client.base_url})"
    else:
        from gateway.validation import config_source, effective_config

        config = ctx.config
        data = effective_config(config)
        source = config_source(config, "files")
        title = "the configuration from the files (no gateway running)"
    if ctx.as_json:
        ctx.print_json({"source": source, **data})
        return EXIT_OK
    ctx.print(f"# {title}: home {source['home']}, file {source['config_path'] or 'none'}")
    ctx.print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip())
    return EXIT_OK


def cmd_config_reload(ctx: Context) -> int:
    """``POST /v1/admin/config/reload``: what changed, what needs a restart; an invalid file is
    refused (exit 1) and nothing changes. Without a running gateway there is nothing to reload.

    The token: ``--token`` or ``NEOTASK_TOKEN``, else ``gateway.tokens`` of the file the gateway
    reloads (``gateway.json`` names it), read even when another key of it is wrong (the gateway
    then says which). A file that gives none (not YAML), or tokens the gateway refuses (changed
    in the file: it runs with those of its last load), is a clear error naming the cause."""
    from gateway.client import ApiError, GatewayClient

    info = ctx.gateway_info()
    if info is None or not info.get("url"):
        print(f"error: no gateway runs on {ctx.home}: the next start reads the config file", file=sys.stderr)
        return exits.NOT_RUNNING
    explicit = ctx.explicit_token()
    path, tokens, problem = (None, [explicit], None) if explicit else _reload_tokens(ctx, info)
    client = GatewayClient(str(info["url"]))
    offered: list[str | None] = [*tokens] or [None]
    for token in offered:  # the gateway takes any of its list: the file may list a new one first
        client.token = token
        try:
            body = client.post("/v1/admin/config/reload")
            break
        except ApiError as exc:
            if exc.code != "unauthorized":
                raise
    else:
        print(f"error: unauthorized: {_refused(bool(explicit), path, tokens, problem, info)}", file=sys.stderr)
        return exits.FAILED
    if ctx.as_json:
        ctx.print_json(body)
        return EXIT_OK
    changed, restart = body["changed"], body["restart_required"]
    ctx.print(f"reloaded: {len(changed)} change(s) in force" if changed else "reloaded: nothing changed")
    for path in changed:
        ctx.print(f"  {path}")
    for worker in body.get("workers", []):  # --workers N: each worker's outcome
        said = worker.get("error") or f"{len(worker.get('changed', []))} change(s) in force"
        ctx.print(f"  worker {worker['worker']}: {said}")
    for path in restart:
        print(f"warning: {path} changed in the file but needs a restart of the gateway", file=sys.stderr)
    return EXIT_OK


def _reload_tokens(ctx: Context, info: Mapping[str, Any]) -> tuple[Path | None, list[str], str | None]:
    """The file the gateway reloads, the tokens it names (with this environment's), and why it
    does not load (None when it does)."""
    from config.loader import deep_merge, env_overrides, load_config, read_user_yaml

    named = info.get("config_path")
    config_path = Path(named) if isinstance(named, str) else getattr(ctx.args, "config", None)
    try:
        config = load_config(env=ctx.env, home=ctx.home, config_path=config_path)
        return config.config_path, list(config.settings.gateway.tokens), None
    except ConfigError as exc:
        problem = exc.message
    path = Path(config_path) if config_path else Path(ctx.env.get("NEOTASK_CONFIG") or ctx.home / "config.yaml")
    try:  # another key's error must not hide the token: the gateway names that error itself
        raw = deep_merge(read_user_yaml(path), env_overrides(ctx.env)[0]).get("gateway")
    except ConfigError:
        return path, [], problem
    listed = raw.get("tokens") if isinstance(raw, dict) else None
    tokens = [t for t in listed if isinstance(t, str) and t.strip()] if isinstance(listed, list) else []
    return path, tokens, problem


def _refused(explicit: bool, path: Path | None, tokens: list[str], problem: str | None, info: Mapping[str, Any]) -> str:
    """Why the gateway refused the reload's token, and the ways on."""
    hup = f"`kill -HUP {info.get('pid')}` reloads without a token (its answer goes to logs/gateway.log)"
    if explicit:
        return f"the gateway refused the token given (--token or NEOTASK_TOKEN): pass one of its gateway.tokens; {hup}"
    source = str(path) if path else "the configuration (defaults and environment, no config file)"
    if not tokens:  # the file's own problem last: a YAML error spans lines
        return (
            f"the gateway needs a token and {source} gives none: fix the file (the gateway runs on with the"
            f" settings of its last load) or pass one of its tokens with --token or NEOTASK_TOKEN; {hup}."
            + (f" The file: {problem}" if problem else " It names no gateway.tokens.")
        )
    return (
        f"the gateway refused the gateway.tokens of {source}: it runs with the tokens of its last load (changed"
        f" since?); pass one of those with --token or NEOTASK_TOKEN; {hup}"
    )


# -- doctor ----------------------------------------------------------------------------------------


def cmd_doctor(ctx: Context) -> int:
    fix = bool(ctx.args.fix)
    client = ctx.client()
    body = client.post("/v1/admin/doctor", {"fix": fix}) if client else offline.run_doctor(ctx.config, fix=fix)
    actions = body.get("actions", [])
    left = [a for a in actions if a.get("severity") == "error" and not a.get("fixed")]
    for action in left:  # what stops or damages the gateway, one line each, whatever the format
        detail = str(action["detail"])
        fixable = action.get("fix") and action.get("fixable", True)  # else a restart or a person
        hint = "; `neotask doctor --fix` fixes it" if fixable and "doctor --fix" not in detail else ""
        print(f"error: {detail}{hint}", file=sys.stderr)
    status = EXIT_STATE if left else EXIT_OK
    if ctx.as_json:
        ctx.print_json(body)
        return status
    if not actions:
        ctx.print("no problems found")
        return EXIT_OK
    header = ("CHECK", "SEVERITY", "DETAIL", "FIXED" if fix else "FIX (--fix)")
    rows = [
        (a["check"], a["severity"], a["detail"], ("yes" if a.get("fixed") else "no") if fix else (a.get("fix") or "-"))
        for a in actions
    ]
    ctx.print(_table(header, rows))
    fixed = sum(1 for a in actions if a.get("fixed"))
    ctx.print(f"{len(actions)} finding(s)" + (f", {fixed} fixed" if fix else ""))
    return status
