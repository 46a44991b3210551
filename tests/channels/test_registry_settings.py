"""Every platform of the registry is checked and wired from its one entry: an account naming an
unknown agent is refused with the platform's own path, and the secrets a service unit must pass are
the variables the registry says an account needs."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from channels.registry import PLATFORMS
from config.settings import Settings

MINIMAL: dict[str, dict[str, Any]] = {
    "telegram": {"token_env": "TG_TOKEN"},
    "slack": {"bot_token_env": "SLACK_BOT", "app_token_env": "SLACK_APP"},
    "discord": {"token_env": "DISCORD_TOKEN"},
    "matrix": {
        "homeserver": "https://matrix.example.org",
        "user_id": "@bot:example.org",
        "access_token_env": "MX_TOKEN",
    },
}


def test_every_platform_has_a_minimal_account_here() -> None:
    assert set(MINIMAL) == set(PLATFORMS)  # a new platform: add its minimal account above


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_an_account_of_an_unknown_agent_is_refused_naming_its_platform(platform: str) -> None:
    account = {**MINIMAL[platform], "agent": "nobody"}
    with pytest.raises(ValidationError, match=rf"channels\.{platform}\.accounts\.a1\.agent 'nobody' is not"):
        Settings.model_validate({"channels": {platform: {"accounts": {"a1": account}}}})
    settings = Settings.model_validate({"channels": {platform: {"accounts": {"a1": MINIMAL[platform]}}}})
    assert [(p, n) for p, n, _ in settings.channels.accounts()] == [(platform, "a1")]
    [(entry, _, built)] = [(PLATFORMS[p], n, a) for p, n, a in settings.channels.accounts()]
    assert entry.needs(built) and all(name in MINIMAL[platform].values() for name in entry.needs(built))
