"""``neotask service``: the systemd unit (checked by Debian's ``systemd-analyze verify``), the
readiness protocol a ``Type=notify`` unit waits for (a real daemon, a socket the test listens on),
and install/status/uninstall driving ``systemctl``.

No systemd runs here as a service manager, so ``systemctl`` is a recording script on PATH in the
install tests; what they check is which commands run in which order and what lands on disk."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from gateway import exits, systemd
from gateway.cli import main
from tests.gateway.daemons import child_env, start_daemon

pytestmark = pytest.mark.realtime  # a real daemon and systemd-analyze processes

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is missing (make systemd)")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def verify(unit_file: Path, *, user: bool) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    runtime = unit_file.parent / "runtime"  # a user manager's runtime folder, which verify needs
    runtime.mkdir(mode=0o700, exist_ok=True)
    command = [ANALYZE, *(["--user"] if user else []), "verify", str(unit_file)]
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


@needs_analyze
@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str], user: bool) -> None:
    home, outside = tmp_path / "home", tmp_path / "elsewhere" / "workspace"
    home.mkdir(mode=0o700)
    (home / "config.yaml").write_text(f"agents:\n  main:\n    workspace: {outside}\n")
    code, out, err = cli(capsys, "service", "install", "--print", "--home", str(home), *(["--user"] if user else []))
    assert code == 0, err
    assert "is under /tmp: the service's private /tmp (PrivateTmp=yes) hides it" in err  # pytest's homes are
    unit = tmp_path / "neotask.service"
    unit.write_text(out)
    checked = verify(unit, user=user)
    assert checked.returncode == 0 and checked.stderr == "" and checked.stdout == "", checked
    lines = set(out.splitlines())
    assert {
        "Type=notify",
        "ExecReload=kill -HUP $MAINPID",
        "Restart=on-failure",
        f"RestartPreventExitStatus={exits.USAGE} {exits.CONFIG} {exits.LOCKED} {exits.STATE}",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        f"ReadWritePaths={home} -{outside}",  # the workspace outside the home is writable too
        "PrivateTmp=yes",
        f"EnvironmentFile=-{home}/service.env",
    } <= lines, out
    assert "RestartPreventExitStatus=2 4 73 78" in lines  # the statuses of gateway/exits.py, as documented
    start = next(line for line in lines if line.startswith("ExecStart="))
    assert re.fullmatch(rf"ExecStart=/\S+ gateway --home {re.escape(str(home))}", start) or start.endswith(
        f"-m gateway.cli gateway --home {home}"
    ), start
    assert ("User=" in out) is not user and ("WantedBy=default.target" in lines) is user
    assert not (tmp_path / "systemd").exists() and list(home.iterdir()) == [home / "config.yaml"]  # --print: nothing


@needs_analyze
def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """What the test above relies on: a misspelt key or a bad exit status is reported."""
    unit = systemd.Unit("neotask", tmp_path, ("/bin/true",), (), 10, None)
    broken = tmp_path / "neotask.service"
    broken.write_text(systemd.render(unit).replace("NoNewPrivileges=", "NoNewPrivilege=").replace(" 73 ", " x "))
    checked = verify(broken, user=True)
    assert "Unknown key 'NoNewPrivilege'" in checked.stderr and "Failed to parse value" in checked.stderr


def test_paths_with_spaces_are_refused_and_specifiers_escaped(tmp_path: Path) -> None:
    unit = systemd.Unit("neotask", Path("/srv/my home"), ("/bin/true",), (), 10, "alice")
    with pytest.raises(ValueError, match="contains a space"):
        systemd.render(unit)
    text = systemd.render(systemd.Unit("neotask", Path("/srv/h%n"), ("/opt/x y/neotask", "$HOME"), (), 10, "alice"))
    assert 'ExecStart="/opt/x y/neotask" $$HOME' in text and "ReadWritePaths=/srv/h%%n" in text


def test_notify_sends_a_datagram_to_a_socket_path(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(path))
        assert systemd.notify("READY=1", {"NOTIFY_SOCKET": str(path)}) is True
        assert listener.recv(4096) == b"READY=1"
    assert systemd.notify("READY=1", {}) is False  # not under systemd: nothing, no error
    with caplog.at_level(logging.WARNING):
        assert systemd.notify("STOPPING=1", {"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}) is False
    assert "could not tell systemd STOPPING=1" in caplog.text


async def test_the_daemon_tells_systemd_ready_reloading_and_stopping(tmp_path: Path) -> None:
    """A real daemon (about 1.2 s of CPU) with NOTIFY_SOCKET naming an abstract socket the test holds."""
    name = f"neotask-test-{os.getpid()}-{secrets.token_hex(4)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind("\0" + name)
    listener.setblocking(False)
    loop = asyncio.get_running_loop()

    async def message() -> str:
        async with asyncio.timeout(20):
            return (await loop.sock_recv(listener, 4096)).decode()

    home = tmp_path / "home"
    try:
        daemon = await start_daemon(home, env=child_env(NOTIFY_SOCKET=f"@{name}"))
        try:
            assert await message() == f"READY=1\nSTATUS=listening on {daemon.url}"  # after it listens
            assert (home / "gateway.json").exists()
            daemon.send(signal.SIGHUP)
            reloading = await message()
            assert re.fullmatch(r"RELOADING=1\nMONOTONIC_USEC=\d+\nSTATUS=reloading the configuration", reloading)
            assert await message() == f"READY=1\nSTATUS=listening on {daemon.url}"
            daemon.send(signal.SIGTERM)
            assert await message() == "STOPPING=1\nSTATUS=shutting down"
            assert await daemon.wait() == 0
        finally:
            if daemon.proc.returncode is None:
                daemon.proc.kill()
                await daemon.wait()
    finally:
        listener.close()


# -- install, status, uninstall -------------------------------------------------------------------

FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "{log}"
case " $* " in *" show "*) printf 'LoadState=loaded\\nActiveState=active\\nSubState=running\\nMainPID=4242\\n'
  printf 'UnitFileState=enabled\\nNRestarts=0\\nExecMainStatus=0\\n';; esac
exit 0
"""


@pytest.fixture
def systemctl_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A recording ``systemctl`` first on PATH, and the user's config folder under tmp_path."""
    bin_dir, log = tmp_path / "bin", tmp_path / "systemctl.log"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    script.write_text(FAKE_SYSTEMCTL.format(log=log))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in ("OPENAI_API_KEY", "NEOTASK_HOME", "NEOTASK_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    return log


def test_install_status_uninstall_a_user_unit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], systemctl_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.yaml").write_text("agents:\n  main:\n    model:\n      base_url: http://127.0.0.1:9/v1\n")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-in-the-shell")  # the service will not see it
    code, out, err = cli(capsys, "service", "install", "--user", "--home", str(home))
    assert code == 0, err
    unit = tmp_path / "xdg" / "systemd" / "user" / "neotask.service"
    assert f"wrote {unit}" in out and stat.S_IMODE(unit.stat().st_mode) == 0o644
    assert "Type=notify" in unit.read_text() and f"--home {home}" in unit.read_text()
    assert f"put OPENAI_API_KEY in {home}/service.env" in out
    assert "OPENAI_API_KEY is not set" in out  # config check's warning, as the service will see it
    assert systemctl_log.read_text().splitlines() == ["--user daemon-reload", "--user enable --now neotask.service"]

    code, out, _ = cli(capsys, "service", "status", "--user", "--home", str(home))
    assert code == 0 and "systemd    active (running), enabled, main pid 4242" in out, out
    assert "gateway    not running" in out

    code, out, _ = cli(capsys, "service", "uninstall", "--user", "--home", str(home))
    assert code == 0 and not unit.exists() and f"removed {unit}" in out
    assert systemctl_log.read_text().splitlines()[3:] == [
        "--user disable --now neotask.service",
        "--user daemon-reload",
    ]
    code, out, _ = cli(capsys, "service", "uninstall", "--user", "--home", str(home))
    assert code == 0 and "is not installed" in out


@pytest.mark.parametrize(
    ("config", "service_env"),
    [("gateway:\n  host: 0.0.0.0\n", None), ("", "# the service's own\nNEOTASK_GATEWAY__HOST='0.0.0.0'\n")],
    ids=["config-file", "service-env"],
)
def test_install_refuses_a_configuration_the_service_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], systemctl_log: Path, config: str, service_env: str | None
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.yaml").write_text(config)
    if service_env is not None:
        (home / "service.env").write_text(service_env)
    code, _, err = cli(capsys, "service", "install", "--user", "--home", str(home))
    assert code == exits.CONFIG and "refusing to listen on 0.0.0.0 without a token" in err, err
    assert not (tmp_path / "xdg").exists() and not systemctl_log.exists()


def test_install_without_systemctl_keeps_the_unit_and_names_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    code, _, err = cli(capsys, "service", "install", "--user", "--home", str(tmp_path / "home"))
    assert code == exits.FAILED
    assert "systemctl is not installed; run it where systemd runs: systemctl --user daemon-reload" in err
    assert (tmp_path / "xdg" / "systemd" / "user" / "neotask.service").exists()
    code, out, _ = cli(capsys, "service", "status", "--user", "--home", str(tmp_path / "home"))
    assert code == exits.NOT_RUNNING and "systemd    unknown: systemctl is not installed" in out
