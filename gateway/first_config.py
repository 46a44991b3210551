"""The first configuration file of a home (``neotask init``): the answers it takes, the check of
each answer (with the reason a bad one is refused), and the YAML it writes, a comment on every line.

The file holds only what the answers set; everything else keeps its default from
``config/defaults.yaml`` (``neotask config show`` prints the merged result).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import yaml

from config.fields import check_env_name, check_url
from config.loader import parse_yaml
from config.settings import ResetMode

RESET_MODES: tuple[ResetMode, ...] = ("daily", "idle", "both", "none")
COMMENT_COLUMN = 40


@dataclass(frozen=True)
class Answers:
    """What ``neotask init`` asks. ``base_url`` None: store-only (no model); a token variable None:
    no account on that platform."""

    base_url: str | None = None
    model: str = "gpt-4o-mini"
    api_key_env: str = "OPENAI_API_KEY"
    telegram_token_env: str | None = None
    slack_bot_token_env: str | None = None
    slack_app_token_env: str = "SLACK_APP_TOKEN"
    discord_token_env: str | None = None
    matrix_homeserver: str | None = None
    matrix_user_id: str | None = None
    matrix_token_env: str = "MATRIX_ACCESS_TOKEN"
    reset: ResetMode = "daily"
    reset_hour: int = 4
    idle_minutes: float = 240

    def variables(self) -> list[tuple[str, str]]:
        """(variable, what it holds) of every secret the configuration names."""
        found = []
        if self.base_url:
            found.append((self.api_key_env, "the model's API key (leave it unset for a local server that needs none)"))
        if self.telegram_token_env:
            found.append((self.telegram_token_env, "the Telegram bot token (from @BotFather)"))
        if self.slack_bot_token_env:
            found.append((self.slack_bot_token_env, "the Slack bot token (xoxb-...)"))
            found.append((self.slack_app_token_env, "the Slack app-level token (xapp-..., connections:write)"))
        if self.discord_token_env:
            found.append((self.discord_token_env, "the Discord bot token (Developer Portal, Bot, Reset Token)"))
        if self.matrix_homeserver:
            found.append((self.matrix_token_env, "the Matrix bot user's access token (syt_..., from a login)"))
        return found

    @property
    def chat(self) -> bool:
        """Some chat platform is configured."""
        return bool(self.telegram_token_env or self.slack_bot_token_env or self.discord_token_env
                    or self.matrix_homeserver)  # fmt: skip


# -- one answer at a time: the text typed (or the flag) -> the value, or ValueError with the reason --


def _optional(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """Empty or ``none``: no value (the feature stays off)."""

    def parse(text: str) -> Any:
        text = text.strip()
        return None if text.lower() in ("", "none", "-") else check(text)

    return parse


def parse_url(text: str) -> str:
    value = check_url(text.strip())
    assert value is not None
    return value.rstrip("/")


def parse_model(text: str) -> str:
    text = text.strip()
    if not text or any(c.isspace() or not c.isprintable() for c in text):
        raise ValueError(f"{text!r} is not a model name: one word the server knows, e.g. gpt-4o-mini or llama3.1:8b")
    return text


def parse_env_name(text: str) -> str:
    text = text.strip()
    try:
        value = check_env_name(text)
    except ValueError:
        raise ValueError(
            f"{_shown(text)} is not an environment variable name: write the variable's name (letters, digits, _;"
            " e.g. OPENAI_API_KEY), never the secret itself"
        ) from None
    assert value is not None
    return value


def _shown(text: str) -> str:
    """A refused answer as it is shown back: what looks like a secret is not printed whole."""
    return repr(text) if len(text) <= 12 else repr(text[:4] + "...")


def parse_matrix_user(text: str) -> str:
    text = text.strip()
    if not re.fullmatch(r"@[^:\s]+:\S+", text):
        raise ValueError(f"{text!r} is not a Matrix user id: write it whole, e.g. @bot:example.org")
    return text


def parse_reset(text: str) -> ResetMode:
    text = text.strip().lower()
    for mode in RESET_MODES:
        if text == mode:
            return mode
    raise ValueError(f"{text!r} is not a reset policy: one of {', '.join(RESET_MODES)}")


def parse_hour(text: str) -> int:
    try:
        hour = int(text.strip())
    except ValueError:
        hour = -1
    if not 0 <= hour <= 23:
        raise ValueError(f"{text.strip()!r} is not an hour: a whole number from 0 to 23 (local time)")
    return hour


def parse_minutes(text: str) -> float:
    try:
        minutes = float(text.strip())
    except ValueError:
        minutes = 0.0
    if not minutes > 0 or minutes != minutes or minutes == float("inf"):
        raise ValueError(f"{text.strip()!r} is not a number of minutes above 0 (e.g. 240)")
    return int(minutes) if minutes.is_integer() else minutes


PARSERS: dict[str, Callable[[str], Any]] = {
    "base_url": _optional(parse_url),
    "model": parse_model,
    "api_key_env": parse_env_name,
    "telegram_token_env": _optional(parse_env_name),
    "slack_bot_token_env": _optional(parse_env_name),
    "slack_app_token_env": parse_env_name,
    "discord_token_env": _optional(parse_env_name),
    "matrix_homeserver": _optional(parse_url),
    "matrix_user_id": _optional(parse_matrix_user),
    "matrix_token_env": parse_env_name,
    "reset": parse_reset,
    "reset_hour": parse_hour,
    "idle_minutes": parse_minutes,
}
assert set(PARSERS) == {f.name for f in fields(Answers)}


# -- the file --------------------------------------------------------------------------------------

Node = tuple[str, Any, str]  # (key, a scalar or a list of nodes, comment)


def tree(answers: Answers) -> list[Node]:
    """The keys the answers set, each with the comment written beside it."""
    if answers.base_url:
        model: list[Node] = [
            ("base_url", answers.base_url, "the OpenAI-compatible server (null: store-only, no model)"),
            ("name", answers.model, "the model the server answers with"),
            ("api_key_env", answers.api_key_env, "the variable holding the API key (never the key itself)"),
        ]
    else:
        model = [("base_url", None, "no model: store-only (stores, routes, commands; no replies)")]
    reset: list[Node] = [("mode", answers.reset, "daily | idle | both | none: when a session starts a new run")]
    if answers.reset in ("daily", "both"):
        reset.append(("at_hour", answers.reset_hour, "the local hour of the daily reset (0-23)"))
    if answers.reset in ("idle", "both"):
        reset.append(("idle_minutes", answers.idle_minutes, "a session idle this long is reset"))
    nodes: list[Node] = [
        ("agents", [("main", [("model", model, "the model this agent answers through")],
                     "the agent every channel and API call uses unless a binding names another")],
         "one block per agent (docs: config/defaults.yaml, agents.main)"),
        ("session", [("reset", reset, "the reset policy: the next run inherits a summary of the last")],
         "how sessions are kept and reset"),
    ]  # fmt: skip
    accounts: list[Node] = []
    if answers.telegram_token_env:
        accounts.append(_one_account("telegram", [
            ("token_env", answers.telegram_token_env, "the variable holding the bot token (never the token)"),
        ], "one bot", "Telegram bots"))  # fmt: skip
    if answers.slack_bot_token_env:
        accounts.append(_one_account("slack", [
            ("bot_token_env", answers.slack_bot_token_env, "the variable holding the bot token (xoxb-...)"),
            ("app_token_env", answers.slack_app_token_env, "the variable holding the app token (xapp-...)"),
        ], "one app in Socket Mode", "Slack apps"))  # fmt: skip
    if answers.discord_token_env:
        accounts.append(_one_account("discord", [
            ("token_env", answers.discord_token_env, "the variable holding the bot token (never the token)"),
        ], "one bot", "Discord bots"))  # fmt: skip
    if answers.matrix_homeserver:
        accounts.append(_one_account("matrix", [
            ("homeserver", answers.matrix_homeserver, "the homeserver's client-server API"),
            ("user_id", answers.matrix_user_id, "the bot user's full id"),
            ("access_token_env", answers.matrix_token_env, "the variable holding its access token (syt_...)"),
        ], "one bot user", "Matrix bot users"))  # fmt: skip
    if accounts:
        nodes.append(("channels", accounts, "chat connectors"))
    return nodes


def _one_account(platform: str, keys: list[Node], what: str, title: str) -> Node:
    """A platform's block with its one account ``main``, posting to agent main, let in by pairing."""
    pairing = "an unknown sender gets a code; let them in: neotask channels approve CODE"
    main: Node = ("main", [*keys, ("dm_policy", "pairing", pairing)], f"{what}, posting to agent main")
    return (platform, [("accounts", [main], f"docs/channels-{platform}.md")], title)


def data(nodes: list[Node]) -> dict[str, Any]:
    return {key: data(value) if isinstance(value, list) else value for key, value, _ in nodes}


def render(answers: Answers, *, written_by: str) -> str:
    """The YAML text: a header, then every key with its comment; parsing it gives ``data(tree(answers))``."""
    nodes = tree(answers)
    lines = [
        f"# Neotask configuration, written by {written_by}.",
        "# Only what differs from the defaults is here: every key, its default and what it does is in",
        "# config/defaults.yaml (in the package); `neotask config show` prints the merged result and",
        "# `neotask config check` checks this file as the gateway will. Secrets never go in this file:",
        "# it names the environment variables that hold them.",
        "",
    ]
    _lines(nodes, 0, lines)
    text = "\n".join(lines) + "\n"
    if parse_yaml(text) != data(nodes):  # a value YAML reads back differently must never be written
        raise AssertionError(f"the rendered configuration does not read back as written:\n{text}")
    return text


def _lines(nodes: list[Node], depth: int, out: list[str]) -> None:
    for key, value, comment in nodes:
        head = f"{'  ' * depth}{key}:" + ("" if isinstance(value, list) else f" {_scalar(value)}")
        out.append(f"{head.ljust(COMMENT_COLUMN - 1)} # {comment}")
        if isinstance(value, list):
            _lines(value, depth + 1, out)


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = str(value)
    try:
        plain = "#" not in text and parse_yaml(f"k: {text}") == {"k": text}
    except yaml.YAMLError:
        plain = False
    return text if plain else '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
