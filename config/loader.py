"""Load the configuration once: defaults.yaml, then the user's YAML, then NEOTASK_* variables,
then flags; validate with pydantic and freeze.

Nothing here reads ``os.environ`` by itself: callers pass the environment in, so the daemon reads
it exactly once at start.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from config.errors import ConfigError
from config.settings import Settings

log = logging.getLogger(__name__)

ENV_PREFIX = "NEOTASK_"
SPECIAL_ENV = frozenset({"NEOTASK_HOME", "NEOTASK_CONFIG", "NEOTASK_TOKEN"})


class _YamlLoader(yaml.SafeLoader):
    """YAML 1.2 booleans: only true/false, so keys such as ``on`` stay strings."""


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_YamlLoader)


@dataclass(frozen=True)
class LoadedConfig:
    settings: Settings
    home: Path
    config_path: Path | None
    warnings: tuple[str, ...] = ()


def defaults_text() -> str:
    return resources.files("config").joinpath("defaults.yaml").read_text(encoding="utf-8")


def load_defaults() -> dict[str, Any]:
    data = parse_yaml(defaults_text())
    assert isinstance(data, dict)
    return data


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; lists and scalars replace."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve_home(flag: str | Path | None, env: Mapping[str, str]) -> Path:
    raw = flag or env.get("NEOTASK_HOME") or "~/.neotask"
    return Path(raw).expanduser().resolve()


def read_user_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def _unwrap(annotation: Any) -> Any:
    """``X | None`` → ``X``."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is not None and type(None) in get_args(annotation) and len(args) == 1:
        return args[0]
    return annotation


def _node(annotation: Any, path: list[str]) -> tuple[bool, Any]:
    """Follow a key path through the models; ``(exists, annotation at the end)``."""
    for part in path:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(part)
            if field is None:
                return False, None
            annotation = field.annotation
        elif get_origin(annotation) is dict:
            annotation = get_args(annotation)[1]
        elif get_origin(annotation) is tuple and part.isdigit():
            annotation = get_args(annotation)[0]
        else:
            return False, None
    return True, _unwrap(annotation)


def _is_key_path(path: list[str]) -> bool:
    """Whether a path names a setting (``agents.<any id>...`` and other dict keys allowed)."""
    return _node(Settings, path)[0]


def env_overrides(env: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """``NEOTASK_A__B=value`` → ``{"a": {"b": <yaml scalar>}}``; the names that are no key."""
    tree: dict[str, Any] = {}
    unknown: list[str] = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in SPECIAL_ENV:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX) :].split("__")]
        if not all(path) or not _is_key_path(path):
            unknown.append(name)
            continue
        try:
            value = parse_yaml(env[name])
        except yaml.YAMLError:
            value = env[name]
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return tree, unknown


def read_variables(data: Any) -> set[str]:
    """The environment variables the settings read a secret from (every ``*_env`` key's value:
    ``storage.postgres.password_env``, a bot's ``token_env``...)."""
    if isinstance(data, dict):
        return {v for k, v in data.items() if k.endswith("_env") and isinstance(v, str)} | {
            name for value in data.values() for name in read_variables(value)
        }
    if isinstance(data, (list, tuple)):
        return {name for value in data for name in read_variables(value)}
    return set()


def _with_agent_defaults(merged: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """Every ``agents.<id>`` takes the defaults shown under ``main`` for the keys it leaves out."""
    agents = merged.get("agents")
    if not isinstance(agents, dict):
        return merged
    base = defaults["agents"]["main"]
    merged["agents"] = {
        agent_id: deep_merge(base, block) if isinstance(block, dict) else block for agent_id, block in agents.items()
    }
    return merged


def describe_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            parent = err["loc"][:-1]
            allowed = _allowed_keys(list(parent))
            msg = "unknown key" + (f"; allowed keys here: {', '.join(allowed)}" if allowed else "")
        lines.append(f"{where}: {msg}")
    return "invalid configuration: " + "; ".join(lines)


def _allowed_keys(path: list[Any]) -> list[str]:
    exists, annotation = _node(Settings, [str(p) for p in path])
    if exists and isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def build_settings(data: Mapping[str, Any]) -> Settings:
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_error(exc)) from exc


def load_config(
    *,
    env: Mapping[str, str],
    home: str | Path | None = None,
    config_path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    user_data: Mapping[str, Any] | None = None,
) -> LoadedConfig:
    """Defaults → user YAML → environment → flags (``overrides``, a nested mapping).
    ``user_data``: the user's YAML as parsed, for a file not written yet (``neotask init`` checks
    what it will write); ``config_path`` is then where it will be."""
    resolved_home = resolve_home(home, env)
    defaults = load_defaults()
    explicit = config_path or env.get("NEOTASK_CONFIG")
    path: Path | None = Path(explicit).expanduser() if explicit else resolved_home / "config.yaml"
    user: dict[str, Any] = {}
    if user_data is not None:
        user = dict(user_data)
    elif path is not None and (explicit or path.exists()):
        user = read_user_yaml(path)
    elif path is not None and not path.exists():
        path = None
    env_tree, unknown = env_overrides(env)
    merged = deep_merge(deep_merge(deep_merge(defaults, user), env_tree), overrides or {})
    settings = build_settings(_with_agent_defaults(merged, defaults))
    secrets = read_variables(settings.model_dump(mode="python"))  # NEOTASK_PG_PASSWORD is read, not a key
    warnings = [f"ignoring {name}: it names no configuration key" for name in unknown if name not in secrets]
    for warning in warnings:
        log.warning(warning)
    return LoadedConfig(settings=settings, home=resolved_home, config_path=path, warnings=tuple(warnings))
