"""The context every ``neotask`` command is given (``gateway/cli.py`` and its ``cli_*`` modules):
the parsed arguments, the environment, the home, the configuration (loaded once, when asked) and
the client of a daemon running on the home."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from config.loader import LoadedConfig, load_config, resolve_home
from gateway.client import GatewayClient
from home.lock import is_locked, read_gateway_json

START_WAIT_S = 30.0  # how long the CLI waits for a daemon that holds the lock but does not listen yet


def _holder(lock_file: Path) -> str:
    try:
        return lock_file.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


@dataclass
class Context:
    args: argparse.Namespace
    env: Mapping[str, str]
    out: TextIO = field(default_factory=lambda: sys.stdout)
    _config: LoadedConfig | None = None

    @property
    def home(self) -> Path:
        return resolve_home(getattr(self.args, "home", None), self.env)

    @property
    def as_json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    @property
    def config(self) -> LoadedConfig:
        if self._config is None:
            self._config = load_config(
                env=self.env, home=getattr(self.args, "home", None), config_path=getattr(self.args, "config", None)
            )
        return self._config

    def gateway_info(self) -> dict[str, Any] | None:
        """``gateway.json`` of a daemon that holds the lock now (a stale file counts as none).

        A held lock without gateway.json is a daemon starting (it writes the file once it listens)
        or another command working offline: wait for either, up to ``--wait-start`` seconds."""
        lock_file = self.home / "gateway.lock"
        deadline: float | None = None
        while True:
            info = read_gateway_json(self.home)
            if not is_locked(lock_file):
                return None
            if info is not None and _holder(lock_file) in ("", str(info.get("pid"))):
                return info
            wait_s = float(getattr(self.args, "wait_start", START_WAIT_S))
            if deadline is None:
                deadline = time.monotonic() + wait_s
                if wait_s > 0:
                    print(f"waiting up to {wait_s:g} s for the gateway to start (pid {_holder(lock_file) or '?'})",
                          file=sys.stderr, flush=True)  # fmt: skip
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def client(self) -> GatewayClient | None:
        info = self.gateway_info()
        if info is None or not info.get("url"):
            return None
        return GatewayClient(str(info["url"]), token=self.token())

    def explicit_token(self) -> str | None:
        """``--token``, else ``NEOTASK_TOKEN``."""
        explicit = getattr(self.args, "token", None) or self.env.get("NEOTASK_TOKEN")
        return str(explicit) if explicit else None

    def token(self) -> str | None:
        if explicit := self.explicit_token():
            return explicit
        tokens = self.config.settings.gateway.tokens
        return tokens[0] if tokens else None

    def print(self, text: str = "") -> None:
        print(text, file=self.out)

    def print_json(self, data: Any) -> None:
        print(json.dumps(data, ensure_ascii=False, indent=2), file=self.out)
