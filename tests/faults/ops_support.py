"""Helpers for the operations fault tests (issue 10 items 2, 7, 9, 10, 11, 12): config files,
JSON calls against a real daemon, a daemon started under resource limits."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.gateway.daemons import REPO, Daemon, _reap, child_env, cli_args

MAIN = "agent%3Amain%3Amain"


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


async def call(http: aiohttp.ClientSession, method: str, url: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
    async with http.request(method, url, json=body, **kwargs) as resp:
        data = await resp.json(content_type=None)
        return resp.status, data


async def all_messages(http: aiohttp.ClientSession, base: str, run_id: str) -> list[dict[str, Any]]:
    status, body = await call(http, "GET", f"{base}/v1/runs/{run_id}/messages?limit=1000")
    assert status == 200, body
    messages: list[dict[str, Any]] = body["messages"]
    return messages


def nofile_limit(soft: int) -> Callable[[], None]:
    """A ``preexec_fn`` that lowers the child's descriptor limit (``ulimit -n``)."""

    def apply() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply


@contextlib.asynccontextmanager
async def limited_daemon(
    home: Path, *args: str, preexec: Callable[[], None], env: dict[str, str] | None = None
) -> AsyncIterator[Daemon]:
    """A daemon started with ``preexec`` run in the child (e.g. ``nofile_limit``)."""
    stderr_path = home.parent / "limited-daemon.stderr"
    with stderr_path.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *cli_args("gateway", "--home", str(home), "--port", "0", *args),
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=env or child_env(),
            cwd=REPO,
            preexec_fn=preexec,
        )
    started = Daemon(home, proc, stderr_path)
    try:
        await started.wait_listening()
        yield started
    finally:
        await _reap(proc)
