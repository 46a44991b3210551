"""Where a configured gateway keeps what is not the store: each agent's workspace, the memory
index, and the version it runs (for the start-up line and backup manifests)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from config.loader import LoadedConfig


def workspaces(config: LoadedConfig) -> dict[str, Path]:
    home: Path = config.home
    return {
        agent_id: Path(agent.workspace).expanduser() if agent.workspace else home / "workspaces" / agent_id
        for agent_id, agent in config.settings.agents.items()
    }


def memory_uri(config: LoadedConfig) -> Path:
    uri = config.settings.memory.uri
    return Path(uri).expanduser() if uri else config.home / "memory.lance"


def version() -> str:
    try:
        return metadata.version("neotask")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def url_for(host: str, port: int) -> str:
    """The URL a local client uses: a wildcard address is reached through loopback."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"
