"""Real ``neotask`` processes for tests: start a daemon on a tmp home, wait for its URL, stop it.

Everything is asyncio (``create_subprocess_exec``) so tests never block their event loop; every
process is killed and reaped, and its pipes closed, whatever the test does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
_LISTENING = re.compile(r"listening on (http://\S+) ")
_COUNTER = itertools.count(1)


def child_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any NEOTASK_* setting, plus ``extra``.

    The memory sweep is pushed out of these short-lived daemons: each sweep loads the embedding
    model, which takes seconds that a shutdown then waits for; these tests are about the process
    lifecycle, not memory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEOTASK_")}
    env["NEOTASK_MEMORY__WATCH__POLL_SECONDS"] = "3600"
    env.update(extra)
    return env


def cli_args(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway.cli", *args]


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


async def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30.0) -> CliResult:
    """Run ``neotask <args>`` to completion."""
    proc = await asyncio.create_subprocess_exec(
        *cli_args(*args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env or child_env(),
        cwd=REPO,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        await _reap(proc)
    assert proc.returncode is not None
    return CliResult(proc.returncode, out.decode(), err.decode())


@dataclass
class Daemon:
    home: Path
    proc: asyncio.subprocess.Process
    stderr_path: Path
    url: str = ""
    banner: str = ""
    stdout: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    async def wait_listening(self, timeout: float = START_TIMEOUT_S) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                raw = await self.proc.stdout.readline()
                if not raw:
                    raise AssertionError(f"the daemon exited before listening:\n{self.stderr()}")
                line = raw.decode()
                self.stdout.append(line)
                if match := _LISTENING.search(line):
                    self.banner, self.url = line.strip(), match.group(1)
                    return self.url

    def send(self, signum: int) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signum)

    async def stop(self, signum: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Signal and wait for the exit status."""
        self.send(signum)
        return await self.wait(timeout)

    async def wait(self, timeout: float = 15.0) -> int:
        """The exit status (draining stdout so the pipe closes)."""
        out, _ = await asyncio.wait_for(self.proc.communicate(), timeout)
        self.stdout.append(out.decode())
        assert self.proc.returncode is not None
        return self.proc.returncode


async def start_daemon(
    home: Path, *args: str, env: dict[str, str] | None = None, wait: bool = True, timeout: float = START_TIMEOUT_S
) -> Daemon:
    stderr_path = home.parent / f"daemon-{next(_COUNTER)}.stderr"
    with stderr_path.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *cli_args("gateway", "--home", str(home), "--port", "0", *args),
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=env or child_env(),
            cwd=REPO,
        )
    daemon = Daemon(home, proc, stderr_path)
    if wait:
        try:
            await daemon.wait_listening(timeout)
        except BaseException:
            await _reap(proc)
            raise
    return daemon


@contextlib.asynccontextmanager
async def daemon(
    home: Path, *args: str, env: dict[str, str] | None = None, timeout: float = START_TIMEOUT_S
) -> AsyncIterator[Daemon]:
    """A started daemon, killed and reaped on the way out if the test left it running (``timeout``:
    how long its start may take; a loaded machine can take a minute only to import)."""
    started = await start_daemon(home, *args, env=env, timeout=timeout)
    try:
        yield started
    finally:
        await _reap(started.proc)


async def _reap(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.communicate(), 10)
