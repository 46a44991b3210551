"""``neotask service install|status|uninstall``: the gateway of one home as a systemd service
(the unit: ``gateway/systemd.py``).

``install`` checks the configuration as the service will load it (its environment is systemd's plus
``<home>/service.env``, not the shell's), writes the unit (``--print``: prints it and writes
nothing), then ``systemctl daemon-reload`` and ``enable --now``. ``--user`` makes a user unit
(``~/.config/systemd/user``), else a system one (``/etc/systemd/system``, run as the home's owner).
Exit status: 0 done, 1 systemctl failed (the unit file is written: its command is printed), 3 from
``status`` when the service is not running or not installed, 4 an invalid configuration.
"""

from __future__ import annotations

import argparse
import os
import pwd
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from config.loader import LoadedConfig, load_config
from gateway import exits, systemd
from gateway.places import memory_uri, workspaces

if TYPE_CHECKING:
    from gateway.cli_context import Context

SHOWN = ("LoadState", "ActiveState", "SubState", "MainPID", "UnitFileState", "NRestarts", "ExecMainStatus")
SYSTEMCTL_TIMEOUT_S = 60


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    service = commands.add_parser("service", help="run the gateway as a systemd service: install|status|uninstall")
    actions = service.add_subparsers(dest="action", required=True, metavar="ACTION")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--user", action="store_true", help="a user unit (systemctl --user) instead of a system one")
    where.add_argument("--name", default="neotask", help="the unit's name (default neotask: neotask.service)")
    install = actions.add_parser("install", parents=[common, where], help="write the unit, enable and start it")
    install.add_argument("--print", action="store_true", help="print the unit and change nothing")
    install.set_defaults(handler=cmd_install)
    status = actions.add_parser("status", parents=[common, where], help="the unit and the gateway it runs")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(handler=cmd_status)
    uninstall = actions.add_parser("uninstall", parents=[common, where], help="stop, disable and remove the unit")
    uninstall.set_defaults(handler=cmd_uninstall)


def service_env(home: Path) -> dict[str, str]:
    """What the service's environment adds to systemd's: ``<home>/service.env`` (NAME=value lines;
    blank lines and # comments skipped, surrounding quotes removed)."""
    found: dict[str, str] = {}
    try:
        text = (home / systemd.ENV_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return found
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        name, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found[name.strip()] = value
    return found


def build_unit(ctx: Context, config: LoadedConfig) -> systemd.Unit:
    home = config.home
    command = [*systemd.program(), "gateway", "--home", str(home)]
    if config.config_path is not None and config.config_path != home / "config.yaml":
        command += ["--config", str(config.config_path)]
    outside = [path for path in [*workspaces(config).values(), memory_uri(config)] if not path.is_relative_to(home)]
    account = None if ctx.args.user else _owner(home)
    return systemd.Unit(
        name=ctx.args.name,
        home=home,
        command=tuple(command),
        writable=tuple(dict.fromkeys(outside)),
        shutdown_timeout_s=config.settings.gateway.shutdown_timeout_s,
        account=account,
    )


def _owner(home: Path) -> str:
    """The account a system unit runs as: the home's owner (this user when it does not exist yet)."""
    try:
        uid = home.stat().st_uid
    except FileNotFoundError:
        uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def cmd_install(ctx: Context) -> int:
    home = ctx.home
    env = {**_manager_env(ctx.env), **service_env(home)}
    config = load_config(env=env, home=home, config_path=getattr(ctx.args, "config", None))
    from gateway.validation import check_config, check_listening

    warnings = [*config.warnings, *check_config(config, env)]  # ConfigError: exit 4, nothing written
    check_listening(config.settings.gateway.tokens, config.settings.gateway.host)
    try:
        unit = build_unit(ctx, config)
        text = systemd.render(unit)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exits.USAGE
    for hidden in systemd.under_private_tmp(unit):
        print(f"warning: {hidden} is under /tmp: the service's private /tmp (PrivateTmp=yes) hides it; "
              "choose a home elsewhere (--home)", file=sys.stderr)  # fmt: skip
    if ctx.args.print:
        ctx.print(text.rstrip("\n"))
        return exits.OK
    path = systemd.unit_dir(user=ctx.args.user, env=ctx.env) / unit.file_name
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text, encoding="utf-8")
    temporary.chmod(0o644)  # systemd reads it; it holds no secret
    os.replace(temporary, path)
    ctx.print(f"{'replaced' if existed else 'wrote'} {path}")
    for warning in warnings:
        ctx.print(f"warning (as the service will see it): {warning}")
    if not (home / systemd.ENV_FILE).exists() and _named_secrets(config):
        ctx.print(f"the service does not see this shell's variables: put {', '.join(_named_secrets(config))} "
                  f"in {home / systemd.ENV_FILE} (NAME=value lines, mode 0600)")  # fmt: skip
    for step in (["daemon-reload"], ["enable", "--now", unit.file_name]):
        if not _systemctl(ctx, step):
            return exits.FAILED
    hint = " --user" if ctx.args.user else ""
    ctx.print(f"started {unit.file_name}; see: neotask service status{hint}, journalctl{hint} -u {unit.name}")
    return exits.OK


def _manager_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables a service gets from its manager (not the shell's secrets or NEOTASK_* settings)."""
    return {name: env[name] for name in ("HOME", "USER", "LOGNAME", "PATH", "LANG") if name in env}


def _named_secrets(config: LoadedConfig) -> list[str]:
    names = [agent.model.api_key_env for agent in config.settings.agents.values() if agent.model.base_url]
    from channels.registry import configured  # the chat platforms' own list (no SDK is imported)

    for platform, _, account in configured(config.settings.channels):
        names += platform.needs(account)
    return list(dict.fromkeys(names))


def _systemctl(ctx: Context, args: list[str], *, quiet: bool = False) -> bool:
    """Run ``systemctl [--user] <args>``; False (said why, with the command to run) when it failed."""
    command = ["systemctl", *systemd.systemctl_args(*args, user=ctx.args.user)]
    found = systemd.systemctl(ctx.env)
    if found is None:
        if not quiet:
            print(f"error: systemctl is not installed; run it where systemd runs: {' '.join(command)}", file=sys.stderr)
        return False
    try:
        done = subprocess.run(
            [found, *command[1:]], capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S, env=dict(ctx.env)
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        done = subprocess.CompletedProcess(command, 1, "", str(exc))
    if done.returncode != 0:
        if not quiet:
            reason = (done.stderr or done.stdout).strip().splitlines()
            print(f"error: {' '.join(command)} failed (status {done.returncode}): "
                  f"{reason[-1] if reason else 'no message'}", file=sys.stderr)  # fmt: skip
        return False
    return True


def cmd_status(ctx: Context) -> int:
    name = ctx.args.name
    path = systemd.unit_dir(user=ctx.args.user, env=ctx.env) / f"{name}.service"
    body: dict[str, Any] = {"unit": f"{name}.service", "unit_file": str(path), "installed": path.exists()}
    body["systemd"] = _show(ctx, f"{name}.service")
    info = ctx.gateway_info() if ctx.home.exists() else None
    body["gateway"] = {"running": info is not None, **(info or {})}
    active = body["systemd"].get("ActiveState") == "active"
    status = exits.OK if body["installed"] and (active or info is not None) else exits.NOT_RUNNING
    if ctx.as_json:
        ctx.print_json(body)
        return status
    ctx.print(f"unit       {body['unit']} ({path}{'' if body['installed'] else ': not installed'})")
    shown = body["systemd"]
    if "error" in shown:
        ctx.print(f"systemd    unknown: {shown['error']}")
    else:
        state = f"{shown['ActiveState']} ({shown['SubState']}), {shown['UnitFileState'] or 'no unit file'}"
        ctx.print(f"systemd    {state}, main pid {shown['MainPID']}, {shown['NRestarts'] or 0} restart(s), "
                  f"last exit status {shown['ExecMainStatus'] or '-'}")  # fmt: skip
    running = f"running, pid {info['pid']} on {info['url']}" if info else "not running"
    ctx.print(f"gateway    {running} (home {ctx.home})")
    return status


def _show(ctx: Context, unit: str) -> dict[str, str]:
    found = systemd.systemctl(ctx.env)
    command = systemd.systemctl_args("show", unit, "--property=" + ",".join(SHOWN), user=ctx.args.user)
    if found is None:
        return {"error": "systemctl is not installed"}
    try:
        done = subprocess.run([found, *command], capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return {"error": lines[-1] if lines else f"systemctl show exited {done.returncode}"}
    return systemd.parse_show(done.stdout, SHOWN)


def cmd_uninstall(ctx: Context) -> int:
    name = ctx.args.name
    path = systemd.unit_dir(user=ctx.args.user, env=ctx.env) / f"{name}.service"
    if not path.exists():
        ctx.print(f"{name}.service is not installed ({path}): nothing to do")
        return exits.OK
    stopped = _systemctl(ctx, ["disable", "--now", path.name])
    path.unlink()
    ctx.print(f"removed {path}")
    reloaded = _systemctl(ctx, ["daemon-reload"])
    return exits.OK if stopped and reloaded else exits.FAILED
