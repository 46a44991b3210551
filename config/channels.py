"""Chat channel settings (``channels.<telegram|slack|discord|matrix>.accounts.<name>``): which bots the daemon runs, the
environment variable each token comes from (never the token itself), the agent the account posts
to, and who may talk to it. Documented with their defaults in ``config/defaults.yaml``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from config.chat_commands import COMMAND_NAMES, SETTINGS_COMMANDS

_ACCOUNT = re.compile(r"^[A-Za-z0-9_.@+\-]+$")  # no "/" or "#": /hooks/<platform>/<name> must reach it
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DmPolicy = Literal["allowlist", "pairing", "open"]
PAIRING_CODE_LIFETIME_S = Field(3600, ge=60, le=30 * 86400)  # how long a code given to an unknown sender is good


def _ids_as_text(value: Any) -> Any:
    """Platform user ids: Telegram's are numbers; YAML ``[123]`` and ``["123"]`` mean the same."""
    if isinstance(value, list | tuple):
        return tuple(str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value)
    return value


def _env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not an environment variable name; write the name, never the token")
    return value


_A = TypeVar("_A", bound=BaseModel)


def _named(accounts: dict[str, _A]) -> dict[str, _A]:
    """Account names go into URLs (``/hooks/telegram/<name>``) and status: one grammar for every platform."""
    for name in accounts:
        if not _ACCOUNT.match(name):
            raise ValueError(
                f"account name {name!r} must be letters, digits and _ . @ + - only (it is the last segment of "
                f"the webhook route /hooks/<platform>/<name>, which '/' and '#' would break)"
            )
    return accounts


Ids = Annotated[tuple[str, ...], BeforeValidator(_ids_as_text)]  # user (or server) ids, numbers taken as text
EnvName = Annotated[str, AfterValidator(_env_name)]  # where a secret comes from: the variable's name
Accounts = Annotated[dict[str, _A], AfterValidator(_named)]  # a platform's accounts by name


class CommandAccess(_Model):
    """Who may run the chat commands that change a session's settings (``restricted``; ``/model``
    with a name: without one it only shows the model): the owners (the account's ``allow_from``)
    and the admins listed here, anywhere; in a direct chat, also a sender whose session is their
    own (``session.dm_scope`` per-peer or per-channel-peer, or a stranger under ``open`` and
    ``pairing``). Anyone else is answered with a short refusal, and nothing runs."""

    allow_from: Ids = ()
    restricted: tuple[str, ...] = SETTINGS_COMMANDS

    @field_validator("restricted")
    @classmethod
    def _known_commands(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        names = tuple(v.removeprefix("/").casefold() for v in value)
        unknown = [v for v, name in zip(value, names, strict=True) if name not in COMMAND_NAMES]
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))}: not a chat command; the commands are "
                             f"{', '.join(COMMAND_NAMES)}")  # fmt: skip
        return names


def _http_url(value: str | None, example: str) -> str | None:
    """A URL the gateway calls or gives out: ``http://`` or ``https://`` with a host. Without a
    scheme a client library retries for ever and writes the token-bearing URL into its errors."""
    if value is None:
        return value
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http:// or https:// URL with a host; write it whole, e.g. {example}")
    return value


class ChatAccount(_Model):
    """What every platform's account has: the agent it posts to, whether it runs, who may talk to
    it in a direct chat (``dm_policy``; ``allow_from``: the owners), whether a group message must
    mention it to be answered (and whether one that does not is stored), how long a pairing code
    is good, and who may run the restricted chat commands."""

    agent: str = "main"
    enabled: bool = True
    dm_policy: DmPolicy = "allowlist"
    allow_from: Ids = ()
    require_mention: bool = True
    store_unmentioned: bool = False
    pairing_code_lifetime_s: int = PAIRING_CODE_LIFETIME_S
    commands: CommandAccess = CommandAccess()


class TelegramAccount(ChatAccount):
    """One Telegram bot. ``mode``: ``polling`` (long polling, no public URL needed) or ``webhook``
    (Telegram POSTs each update to ``webhook_url``, which must reach the daemon's
    ``/hooks/telegram/<account>``; every call must carry the secret from ``webhook_secret_env``)."""

    token_env: EnvName = "TELEGRAM_BOT_TOKEN"
    api_base: str | None = None  # e.g. http://127.0.0.1:8081 for a self-hosted Bot API server
    mode: Literal["polling", "webhook"] = "polling"
    webhook_url: str | None = None
    webhook_secret_env: EnvName | None = None
    poll_timeout_s: int = Field(25, ge=0, le=50)

    @field_validator("api_base")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        return _http_url(value, "http://127.0.0.1:8081")

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        return _http_url(value, "https://bot.example.org/hooks/telegram/main")

    @model_validator(mode="after")
    def _webhook_needs_url_and_secret(self) -> TelegramAccount:
        if self.mode == "webhook" and (not self.webhook_url or not self.webhook_secret_env):
            raise ValueError(
                "mode: webhook needs webhook_url (the public https URL of /hooks/telegram/<account>) and"
                " webhook_secret_env (the variable holding the secret Telegram sends with every call)"
            )
        return self


class TelegramSettings(_Model):
    accounts: Accounts[TelegramAccount] = {}


class SlackAccount(ChatAccount):
    """One Slack app: ``mode`` ``socket`` (Socket Mode, no public URL needed; the app-level token,
    ``xapp-`` with ``connections:write``, opens the socket) or ``events`` (the Events API: Slack
    POSTs to ``/hooks/slack/<account>``, each call signed with the signing secret). The bot token
    (``xoxb-``) calls the Web API either way."""

    bot_token_env: EnvName = "SLACK_BOT_TOKEN"
    app_token_env: EnvName = "SLACK_APP_TOKEN"
    api_base: str | None = None  # e.g. https://slack-gov.com/api/ for GovSlack; null: https://slack.com/api/
    mode: Literal["socket", "events"] = "socket"
    signing_secret_env: EnvName | None = None  # mode events: the app's signing secret
    reply_in_thread: bool = False  # a mention at a channel's top level is answered in a thread of its own

    @field_validator("api_base")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        return _http_url(value, "https://slack-gov.com/api/")

    @model_validator(mode="after")
    def _events_need_a_secret(self) -> SlackAccount:
        if self.mode == "events" and not self.signing_secret_env:
            raise ValueError("mode: events needs signing_secret_env (the variable holding the app's signing secret)")
        return self


class SlackSettings(_Model):
    accounts: Accounts[SlackAccount] = {}


class DiscordAccount(ChatAccount):
    """One Discord bot (an application's bot user) over the gateway: REST calls go to ``api_base``
    (null: Discord's own ``/api/v10``), and the gateway's URL is what ``GET {api_base}/gateway/bot``
    answers, so a proxy (or a test server) can stand in for both. ``guilds``: the servers (guild
    ids) where it answers in channels (empty: every server it is in); direct messages are governed
    by ``dm_policy`` alone."""

    token_env: EnvName = "DISCORD_TOKEN"
    api_base: str | None = None  # null: https://discord.com/api/v10
    mode: Literal["gateway"] = "gateway"
    guilds: Ids = ()

    @field_validator("api_base")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        return _http_url(value, "https://discord.com/api/v10")

    @field_validator("allow_from", "guilds")
    @classmethod
    def _snowflakes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        wrong = [v for v in value if not v.isdigit()]
        if wrong:
            raise ValueError(f"{', '.join(map(repr, wrong))}: not a Discord id (digits only: turn on Developer Mode,"
                             " then right-click the user or server, Copy ID)")  # fmt: skip
        return value


class DiscordSettings(_Model):
    accounts: Accounts[DiscordAccount] = {}


_MATRIX_USER = re.compile(r"^@[^:\s]+:[^\s]+$")


class MatrixAccount(ChatAccount):
    """One Matrix bot user on a homeserver, over the client-server API's ``/sync`` (no public URL
    needed). ``user_id``: the bot's full id (``@bot:example.org``); its access token comes from
    ``access_token_env``. Rooms: a room the inviter marked direct (``is_direct``) is a direct chat;
    any other room is a group, answered when mentioned (``require_mention``)."""

    homeserver: str
    user_id: str
    access_token_env: EnvName = "MATRIX_ACCESS_TOKEN"
    mode: Literal["sync"] = "sync"
    allow_from: tuple[str, ...] = ()  # Matrix ids are text (@alice:example.org): no number to take as text
    sync_timeout_s: int = Field(30, ge=0, le=120)
    encryption: bool | None = None  # end-to-end encryption; None: on when matrix-nio's e2e extra is installed
    undecryptable: Literal["notice", "ignore"] = "notice"  # an encrypted message without its key

    @field_validator("homeserver")
    @classmethod
    def _homeserver_url(cls, value: str) -> str:
        checked = _http_url(value, "https://matrix.example.org")
        assert checked is not None
        return checked

    @field_validator("user_id")
    @classmethod
    def _user_id(cls, value: str) -> str:
        if not _MATRIX_USER.match(value):
            raise ValueError(f"{value!r} is not a Matrix user id; write it whole, e.g. @bot:example.org")
        return value

    @field_validator("allow_from")
    @classmethod
    def _owners(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [v for v in value if not _MATRIX_USER.match(v)]
        if bad:
            listed = ", ".join(map(repr, bad))
            raise ValueError(f"{listed}: not a Matrix user id; write each whole, e.g. @alice:example.org")
        return value


class MatrixSettings(_Model):
    accounts: Accounts[MatrixAccount] = {}


class OutboxSettings(_Model):
    """Replies waiting to be sent (``<home>/channels.db``): how long a failed send waits before the
    next try, at most."""

    max_backoff_s: float = Field(60, gt=0)


class ChannelsSettings(_Model):
    telegram: TelegramSettings = TelegramSettings()
    slack: SlackSettings = SlackSettings()
    outbox: OutboxSettings = OutboxSettings()
    discord: DiscordSettings = DiscordSettings()
    matrix: MatrixSettings = MatrixSettings()

    def accounts(self) -> Iterator[tuple[str, str, Any]]:
        """(platform, account name, its settings) of every platform's accounts: each field of this
        model that has ``accounts`` is a platform (``channels/registry.py`` names how to run them)."""
        for platform in type(self).model_fields:
            accounts = getattr(getattr(self, platform), "accounts", None)
            for name, account in (accounts or {}).items():
                yield platform, name, account
