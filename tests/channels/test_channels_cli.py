"""``neotask channels`` without a daemon, in-process: ``channels status`` lists the accounts of
every platform of the configuration (it listed Telegram's only: Slack accounts were missing, and a
Slack-only home was told no account was configured), and the help names every platform."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from channels.registry import PLATFORMS
from gateway.cli import build_parser
from tests.gateway.helpers import Cli

pytestmark = pytest.mark.realtime  # the CLI in-process reads the real clock

TELEGRAM = {"tg": {"token_env": "TG_TOKEN"}}
SLACK = {
    "ops": {"bot_token_env": "OPS_BOT", "app_token_env": "OPS_APP", "agent": "helper"},
    "hooks": {"mode": "events", "signing_secret_env": "HOOKS_SECRET", "enabled": False},
}


@pytest.fixture(autouse=True)
def _no_neotask_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [n for n in os.environ if n.startswith("NEOTASK_")]:
        monkeypatch.delenv(name)
    yield


def _home(tmp_path: Path, channels: dict[str, object]) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    config = {"agents": {"main": {}, "helper": {}}, "channels": channels}
    (home / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return home


async def test_offline_status_lists_the_slack_accounts_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = Cli(capsys, _home(tmp_path, {"telegram": {"accounts": TELEGRAM}, "slack": {"accounts": SLACK}}))
    body = await cli.json("channels", "status")
    listed = [
        (a["channel"], a["account"], a["agent"], a["mode"], a["enabled"], a["connected"]) for a in body["accounts"]
    ]
    assert listed == [
        ("telegram", "tg", "main", "polling", True, False),
        ("slack", "ops", "helper", "socket", True, False),
        ("slack", "hooks", "main", "events", False, False),
    ]
    assert {a["last_error"] for a in body["accounts"]} == {"no gateway running"}

    code, out, _ = await cli("channels", "status")
    rows = {
        line.split()[1]: line.split()[:4] for line in out.splitlines()[1:] if line.startswith(("telegram", "slack"))
    }
    assert code == 0 and rows == {
        "tg": ["telegram", "tg", "main", "not"],
        "ops": ["slack", "ops", "helper", "not"],
        "hooks": ["slack", "hooks", "main", "disabled"],
    }, out
    assert out.rstrip().endswith("(no gateway running: the accounts are not connected)")


async def test_a_slack_only_home_is_not_told_it_has_no_accounts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(capsys, _home(tmp_path, {"slack": {"accounts": {"ops": SLACK["ops"]}}}))
    code, out, err = await cli("channels", "status")
    assert code == 0, err
    assert "no chat channel accounts configured" not in out and out.splitlines()[1].split()[:2] == ["slack", "ops"]


def test_the_help_names_every_platform() -> None:
    parser = build_parser()
    listing = parser.format_help()
    line = next(x for x in listing.splitlines() if x.split()[:1] == ["channels"])
    assert all(name.capitalize() in line for name in PLATFORMS), line
