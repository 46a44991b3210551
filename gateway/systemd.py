"""The gateway under systemd: the unit ``neotask service install`` writes, and the readiness
protocol of a ``Type=notify`` service (``sd_notify``: datagrams to ``$NOTIFY_SOCKET``, standard
library only).

The daemon sends ``READY=1`` once it listens (and has written ``gateway.json``), ``STOPPING=1``
when SIGTERM or SIGINT starts its shutdown, and ``RELOADING=1`` ... ``READY=1`` around a SIGHUP
reload. Without ``$NOTIFY_SOCKET`` (not under systemd) nothing is sent.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway import exits

log = logging.getLogger(__name__)

# Exit statuses a restart cannot fix (gateway/exits.py): the command line, the configuration, a
# home another gateway holds, a home whose state must be fixed first.
DO_NOT_RESTART = (exits.USAGE, exits.CONFIG, exits.LOCKED, exits.STATE)
STOP_MARGIN_S = 10  # beyond gateway.shutdown_timeout_s (a supervisor waits for its workers' own)
START_TIMEOUT_S = 300  # a large home's recovery at start may take minutes
ENV_FILE = "service.env"  # in the home: NAME=value lines the service starts with (its secrets)


def notify(state: str, env: Mapping[str, str]) -> bool:
    """Send ``state`` (``READY=1``, newline-separated assignments) to the service manager; False
    when there is none or it could not be reached (logged: the service's state is then wrong)."""
    address = env.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        log.warning("NOTIFY_SOCKET %r is not a unix socket path: systemd is not told %s", address, state)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), address)
    except OSError as exc:
        log.warning("could not tell systemd %s through %s: %s", state.replace("\n", " "), address, exc)
        return False
    return True


def ready(env: Mapping[str, str], url: str) -> None:
    notify(f"READY=1\nSTATUS=listening on {url}", env)


def stopping(env: Mapping[str, str]) -> None:
    notify("STOPPING=1\nSTATUS=shutting down", env)


def reloading(env: Mapping[str, str]) -> None:
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notify(f"RELOADING=1\nMONOTONIC_USEC={usec}\nSTATUS=reloading the configuration", env)


# -- the unit ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """What a unit for one home says. ``account``: the user a system unit runs as (None for a
    ``--user`` unit, which runs as its manager's user)."""

    name: str
    home: Path
    command: tuple[str, ...]
    writable: tuple[Path, ...]  # besides the home: workspaces and the memory index kept elsewhere
    shutdown_timeout_s: float
    account: str | None

    @property
    def user_unit(self) -> bool:
        return self.account is None

    @property
    def file_name(self) -> str:
        return f"{self.name}.service"


def program() -> tuple[str, ...]:
    """How the service runs this neotask: the ``neotask`` script beside this interpreter (a venv's
    bin/), else the interpreter with ``-m gateway.cli``."""
    beside = Path(sys.executable).parent / "neotask"
    if beside.is_file() and os.access(beside, os.X_OK):
        return (str(beside),)
    return (sys.executable, "-m", "gateway.cli")


def check_path(path: Path) -> None:
    """A path a unit can name: systemd splits its path lists at white space."""
    text = str(path)
    if any(c.isspace() or not c.isprintable() for c in text):
        raise ValueError(f"{text!r} contains a space or a control character: a systemd unit cannot name it; "
                         "choose a home (--home) whose path has none")  # fmt: skip


def _escape(text: str) -> str:
    """A specifier's ``%`` and a variable's ``$`` taken literally."""
    return text.replace("%", "%%").replace("$", "$$")


def _quote(arg: str) -> str:
    arg = _escape(arg)
    if arg and not any(c.isspace() or c in "\"'\\;" for c in arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(unit: Unit) -> str:
    for path in (unit.home, *unit.writable):
        check_path(path)
    home = _escape(str(unit.home))
    writable = " ".join([home, *(f"-{_escape(str(p))}" for p in unit.writable)])
    reload_hint = "systemctl --user" if unit.user_unit else "systemctl"
    lines = [
        f"# {unit.file_name} ({'a user unit' if unit.user_unit else 'a system unit'}), written by `neotask service "
        f"install`: the Neotask gateway on the home {unit.home}.",
        f"# Secrets (the model's API key, bot tokens) go in {unit.home / ENV_FILE} as NAME=value lines (mode 0600).",
        f"# {reload_hint} reload {unit.name}: the configuration read again (SIGHUP); status: neotask service status",
        "",
        "[Unit]",
        f"Description=Neotask gateway (home {home})",
    ]
    if not unit.user_unit:  # a user manager has no network-online.target
        lines += ["Wants=network-online.target", "After=network-online.target"]
    lines += [
        "",
        "[Service]",
        "Type=notify",  # READY=1 once it listens (gateway/systemd.py)
        "NotifyAccess=main",
        "ExecStart=" + " ".join(_quote(arg) for arg in unit.command),
        "ExecReload=kill -HUP $MAINPID",
        "Restart=on-failure",
        "RestartSec=5",
        "# 2: a bad command line, 4: an invalid configuration, 73: another gateway holds the home,",
        "# 78: the home's state must be fixed first (`neotask doctor`): restarting cannot help",
        "RestartPreventExitStatus=" + " ".join(str(code) for code in DO_NOT_RESTART),
        f"TimeoutStartSec={START_TIMEOUT_S}",
        f"TimeoutStopSec={math.ceil(unit.shutdown_timeout_s) + STOP_MARGIN_S}",
        "KillMode=mixed",  # SIGTERM to the gateway alone; its workers are its to stop
        f"EnvironmentFile=-{_escape(str(unit.home / ENV_FILE))}",
        f'Environment="XDG_CACHE_HOME={_escape(str(unit.home / "cache"))}"',  # the only writable place for caches
        "UMask=0077",
        "LimitNOFILE=8192",  # gateway.max_connections + gateway.fd_reserve, with room
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        f"ReadWritePaths={writable}",
        "PrivateTmp=yes",
    ]
    if unit.account is not None:
        lines.append(f"User={unit.account}")
    lines += ["", "[Install]", f"WantedBy={'default.target' if unit.user_unit else 'multi-user.target'}", ""]
    return "\n".join(lines)


def under_private_tmp(unit: Unit) -> list[Path]:
    """The paths the unit must write that its private /tmp would hide."""
    return [p for p in (unit.home, *unit.writable) if p.is_relative_to("/tmp") or p.is_relative_to("/var/tmp")]


def unit_dir(*, user: bool, env: Mapping[str, str]) -> Path:
    if not user:
        return Path("/etc/systemd/system")
    config_home = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(config_home) / "systemd" / "user"


def systemctl(env: Mapping[str, str]) -> str | None:
    return shutil.which("systemctl", path=env.get("PATH") or os.defpath)


def systemctl_args(*args: str, user: bool) -> list[str]:
    return [*(["--user"] if user else []), *args]


def parse_show(text: str, names: Sequence[str]) -> dict[str, str]:
    """``systemctl show --property=...`` output: NAME=value lines."""
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {name: values.get(name, "") for name in names}
