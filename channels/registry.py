"""The chat platforms, each named once: its accounts in the settings, the environment variables an
account needs, the mode in which the platform calls the gateway, and the factory that builds a
connector. A factory's body imports the platform's SDK, so a process with no account of a platform
never loads it (aiogram alone costs seconds of CPU).

Every place that lists platforms (the intake, ``config check``, ``channels status``) reads
:data:`PLATFORMS`; adding a platform is its own modules plus one entry here.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from channels.protocol import Connector
from channels.store import ChannelStore
from config.channels import ChannelsSettings, DiscordAccount, SlackAccount, TelegramAccount
from config.clock import Clock

Account = Any  # one platform's account settings (a pydantic model of config/channels.py)


@dataclass(frozen=True)
class Platform:
    """One chat platform. ``accounts``: its accounts in the settings; ``needs``: the environment
    variables an enabled account must find set; ``build``: the connector of one account (the
    SDK is imported there); ``calling_mode``: the mode in which the platform calls
    ``/hooks/<name>/<account>``; ``module``: the connector's module, which imports the SDK."""

    name: str
    accounts: Callable[[ChannelsSettings], Mapping[str, Account]]
    needs: Callable[[Account], list[str]]
    build: Callable[[str, Account, Mapping[str, str], ChannelStore, Clock], Connector]
    calling_mode: str
    module: str

    def missing(self, account: Account, env: Mapping[str, str]) -> list[str]:
        """The variables ``account`` needs that are not set in ``env``."""
        return [name for name in self.needs(account) if not env.get(name)]


def _telegram_needs(account: TelegramAccount) -> list[str]:
    return [account.token_env] + ([account.webhook_secret_env] if account.mode == "webhook" and
                                  account.webhook_secret_env else [])  # fmt: skip


def _telegram(name: str, account: TelegramAccount, env: Mapping[str, str], store: ChannelStore,
              clock: Clock) -> Connector:  # fmt: skip
    from channels.telegram import TelegramConnector

    secret = env.get(account.webhook_secret_env) if account.webhook_secret_env else None
    return TelegramConnector(name, account, env[account.token_env], store, clock=clock, webhook_secret=secret)


def _slack_needs(account: SlackAccount) -> list[str]:
    second = account.app_token_env if account.mode == "socket" else account.signing_secret_env
    return [v for v in (account.bot_token_env, second) if v]


def _slack(name: str, account: SlackAccount, env: Mapping[str, str], store: ChannelStore, clock: Clock) -> Connector:
    from channels.slack import SlackConnector

    secret = env.get(account.signing_secret_env) if account.signing_secret_env else None
    return SlackConnector(name, account, env[account.bot_token_env], env.get(account.app_token_env, ""), store,
                          clock=clock, signing_secret=secret)  # fmt: skip


def _discord(name: str, account: DiscordAccount, env: Mapping[str, str], store: ChannelStore,
             clock: Clock) -> Connector:  # fmt: skip
    from channels.discord import DiscordConnector

    return DiscordConnector(name, account, env[account.token_env], store, clock=clock)


PLATFORMS: dict[str, Platform] = {
    "telegram": Platform(
        "telegram", lambda c: c.telegram.accounts, _telegram_needs, _telegram, "webhook", "channels.telegram"
    ),
    "slack": Platform("slack", lambda c: c.slack.accounts, _slack_needs, _slack, "events", "channels.slack"),
    "discord": Platform(
        "discord", lambda c: c.discord.accounts, lambda a: [a.token_env], _discord, "interactions", "channels.discord"
    ),
}


def configured(channels: ChannelsSettings) -> Iterator[tuple[Platform, str, Account]]:
    """Every configured account, platform by platform: (platform, account name, its settings)."""
    for platform in PLATFORMS.values():
        for name, account in platform.accounts(channels).items():
            yield platform, name, account


async def load_sdks(channels: ChannelsSettings, env: Mapping[str, str]) -> None:
    """Import the connector module (and so the SDK) of every platform with an account that will
    start (enabled, its variables set), in a thread: the connectors are built on the event loop (at
    start, and by a reload while it serves), and aiogram alone is 5 s of CPU that would hold it."""
    wanted = sorted(
        {p.module for p, _, account in configured(channels) if account.enabled and not p.missing(account, env)}
    )
    for module in wanted:
        if module not in sys.modules:
            await asyncio.to_thread(importlib.import_module, module)
