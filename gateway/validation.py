"""The checks of a configuration that need gateway code (``config/`` imports nothing of the project,
so pydantic's checks in ``config/settings.py`` cannot make them). The composition root runs them
before it builds anything, and ``neotask config check`` runs the same function: a configuration
the check passes is one the daemon accepts.

Errors raise ``ConfigError``; what the daemon only logs comes back as warnings. Also the
effective configuration as ``neotask config show`` and ``GET /v1/admin/config`` show it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from channels.registry import configured
from channels.webhooks import TemplateError, check_mapping
from config.errors import ConfigError
from config.loader import LoadedConfig
from gateway import eventloop
from gateway.masking import mask_secrets

REDACTED = "***"


def check_config(config: LoadedConfig, env: Mapping[str, str]) -> list[str]:
    """Every webhook template parses, the event loop asked for exists; warnings for hooks whose
    secret is not set (their deliveries are refused until it is) or that take unsigned deliveries."""
    settings = config.settings
    warnings: list[str] = []
    eventloop.resolve(settings.gateway.event_loop)
    for name, mapping in settings.hooks.items():
        try:
            check_mapping(name, mapping)
        except TemplateError as exc:
            raise ConfigError(str(exc)) from None
        if mapping.secret_env is not None and not env.get(mapping.secret_env):
            warnings.append(
                f"hook {name}: {mapping.secret_env} is not set; its deliveries are refused (503) until it is"
            )
        elif mapping.secret_env is None:
            warnings.append(f"hook {name} has no secret_env: it accepts unsigned deliveries")
    for platform, name, account in configured(settings.channels):
        if account.enabled and (missing := platform.missing(account, env)):
            unset = ", ".join(missing) + (" is" if len(missing) == 1 else "")
            warnings.append(f"channels.{platform.name}.accounts.{name}: {unset} not set; this account will not start")
    return warnings


def config_source(config: LoadedConfig, kind: str) -> dict[str, Any]:
    """Which configuration ``config show`` prints: ``kind`` ``gateway`` (a running daemon's) or
    ``files``, with its config file and home."""
    path = str(config.config_path) if config.config_path else None
    return {"kind": kind, "config_path": path, "home": str(config.home)}


def effective_config(config: LoadedConfig, *, host: str | None = None, port: int | None = None) -> dict[str, Any]:
    """The settings as JSON, tokens redacted and URLs' secrets masked (``gateway/masking.py``);
    ``host``/``port``: where the daemon really listens (``--host``/``--port`` override the file,
    port 0 means any free one)."""
    data: dict[str, Any] = mask_secrets(config.settings.model_dump(mode="json"))
    gateway = data["gateway"]
    if gateway.get("tokens"):
        gateway["tokens"] = [REDACTED for _ in gateway["tokens"]]
    if host is not None:
        gateway["host"] = host
    if port is not None:
        gateway["port"] = port
    return data
