"""Build a gateway app over a tmp home, with or without the local OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from config.clock import Clock
from config.loader import LoadedConfig, build_settings, deep_merge, load_defaults
from gateway.app import create_app
from gateway.cli import main


def gateway_config(home: Path, overrides: dict[str, Any] | None = None, *, base_url: str | None = None) -> LoadedConfig:
    data = load_defaults()
    if base_url is not None:
        model = {"base_url": base_url, "name": "test-model", "timeout_s": 5, "max_retries": 0}
        data = deep_merge(data, {"agents": {"main": {"model": model}}})
    data = deep_merge(data, overrides or {})
    return LoadedConfig(settings=build_settings(data), home=home, config_path=None)


def make_app(
    home: Path,
    clock: Clock,
    overrides: dict[str, Any] | None = None,
    *,
    base_url: str | None = None,
    env: dict[str, str] | None = None,
) -> web.Application:
    return create_app(gateway_config(home, overrides, base_url=base_url), clock=clock, env=env or {})


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under a home with a hash of its bytes (for "nothing changed on disk")."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            if name.endswith(("-wal", "-shm")):
                continue
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


class Cli:
    """The ``neotask`` CLI run in-process on one home (``--home``), its output captured."""

    def __init__(self, capsys: pytest.CaptureFixture[str], home: Path) -> None:
        self.capsys = capsys
        self.home = home

    async def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = await asyncio.to_thread(main, [*args, "--home", str(self.home)])
        out, err = self.capsys.readouterr()
        return code, out, err

    async def json(self, *args: str, code: int = 0) -> Any:
        got, out, err = await self(*args, "--json")
        assert got == code, err
        return json.loads(out)
