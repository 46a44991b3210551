"""``channels.telegram.accounts`` as the issue writes it is accepted by ``neotask config check``;
a bad key or value is named; an unset token variable is a warning."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.gateway.daemons import child_env, run_cli

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

ISSUE_EXAMPLE = """
channels:
  telegram:
    accounts:
      main: {token_env: TELEGRAM_BOT_TOKEN, api_base: null, agent: main, mode: polling,
             dm_policy: allowlist, allow_from: ["123456789"], require_mention: true}
  slack:
    accounts:
      work: {bot_token_env: SLACK_BOT_TOKEN, app_token_env: SLACK_APP_TOKEN, api_base: null,
             agent: main, mode: socket, dm_policy: allowlist, allow_from: ["U012AB3CD"]}
"""


async def check(tmp_path: Path, text: str, **env: str) -> tuple[int, str, str]:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    result = await run_cli("config", "check", "--home", str(tmp_path / "home"), "--config", str(path),
                           env=child_env(**env))  # fmt: skip
    return result.returncode, result.stdout, result.stderr


async def test_the_issue_example_passes_and_an_unset_token_is_a_warning(tmp_path: Path) -> None:
    tokens = {"TELEGRAM_BOT_TOKEN": "1:x", "SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1"}
    code, out, _ = await check(tmp_path, ISSUE_EXAMPLE, **tokens)
    assert code == 0 and out.startswith("OK") and "warning" not in out
    code, out, _ = await check(tmp_path, ISSUE_EXAMPLE)
    assert code == 0
    assert "channels.telegram.accounts.main: TELEGRAM_BOT_TOKEN is not set; this account will not start" in out
    assert "channels.slack.accounts.work: SLACK_BOT_TOKEN, SLACK_APP_TOKEN not set; this account will not start" in out


@pytest.mark.parametrize(
    ("account", "named"),
    [
        ({"dm_polcy": "open"}, "channels.telegram.accounts.main.dm_polcy"),
        ({"dm_policy": "everyone"}, "channels.telegram.accounts.main.dm_policy"),
        ({"mode": "carrier-pigeon"}, "channels.telegram.accounts.main.mode"),
        ({"mode": "webhook"}, "mode: webhook needs webhook_url"),
        ({"agent": "nobody"}, "channels.telegram.accounts.main.agent 'nobody' is not a configured agent"),
        ({"token_env": "123:real-token-pasted"}, "not an environment variable name"),
    ],
)
async def test_a_bad_account_key_or_value_is_named(tmp_path: Path, account: dict[str, str], named: str) -> None:
    text = yaml.safe_dump({"channels": {"telegram": {"accounts": {"main": account}}}})
    code, _, err = await check(tmp_path, text)
    assert code != 0 and named in err, err
