"""The checks of a configuration that need gateway code (``config/`` imports nothing of the project,
so pydantic's checks in ``config/settings.py`` cannot make them). The composition root runs them
before it builds anything, and ``neotask config check`` runs the same function: a configuration
the check passes is one the daemon accepts.

Errors raise ``ConfigError``; what the daemon only logs comes back as warnings. Also the
effective configuration as ``neotask config show`` and ``GET /v1/admin/config`` show it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from channels.access import SHARING_POLICIES
from channels.registry import configured
from channels.webhooks import TemplateError, check_mapping
from config.errors import ConfigError
from config.loader import LoadedConfig
from config.settings import Settings
from gateway import eventloop
from gateway.hosts import bind_address, is_loopback
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
    for agent_id, agent in settings.agents.items():
        key = agent.model.api_key_env
        if agent.model.base_url and key and not env.get(key):
            warnings.append(
                f"agents.{agent_id}.model.api_key_env: {key} is not set; the model is called without a key "
                "(fine for a local server that needs none)"
            )
    for platform, name, account in configured(settings.channels):
        where = f"channels.{platform.name}.accounts.{name}"
        if account.enabled and (missing := platform.missing(account, env)):
            unset = ", ".join(missing) + (" is" if len(missing) == 1 else "")
            warnings.append(f"{where}: {unset} not set; this account will not start")
        if account.enabled:
            warnings.extend(_sharing(where, account, settings))
    return warnings


def _sharing(where: str, account: Any, settings: Settings) -> list[str]:
    """What still puts several people in one session or one memory: strangers get sessions of their
    own (``channels/access.py``), but the owner's ids and a shared memory are the operator's."""
    found = []
    if account.dm_policy in SHARING_POLICIES and settings.memory.scope == "shared":
        found.append(
            f"{where}: dm_policy {account.dm_policy} with memory.scope shared: anyone this account admits reads and "
            f"writes agent {account.agent}'s whole memory (MEMORY.md); set memory.scope: per-peer"
        )
    if settings.session.dm_scope == "main" and len(account.allow_from) > 1:
        found.append(
            f"{where}: allow_from lists {len(account.allow_from)} ids and session.dm_scope is main: their direct "
            f"messages share one session (agent:{account.agent}:main, its prompt and its memory); list only your "
            "own ids, or set session.dm_scope: per-channel-peer"
        )
    return found


def check_listening(tokens: Sequence[str], host: str) -> None:
    """A non-loopback address needs ``gateway.tokens`` (the daemon refuses to start, and ``config
    check`` refuses the file, with this one message)."""
    bound = bind_address(host)
    if not tokens and not is_loopback(bound):
        raise ConfigError(
            f"refusing to listen on {bound} without a token: set gateway.tokens "
            "(or NEOTASK_GATEWAY__TOKENS='[secret]'), or listen on 127.0.0.1"
        )


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
