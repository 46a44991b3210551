"""What ``config check`` passed and the daemon then refused or broke on (issue 40 item 15): a
public address without tokens (the daemon exits 4), a model key variable that is not set (the
model got ``Bearer not-needed``), account names with ``/`` or ``#`` (their webhook routes cannot
be reached)."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.errors import ConfigError
from gateway.validation import check_config, check_listening
from tests.gateway.daemons import child_env, run_cli
from tests.gateway.helpers import gateway_config

pytestmark = pytest.mark.realtime  # its CLI and daemon processes read the real clock


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "[2001:db8::1]", "gateway.example.org"])
def test_a_public_address_without_tokens_is_refused(host: str) -> None:
    with pytest.raises(ConfigError, match=r"without a token: set gateway\.tokens"):
        check_listening((), host)
    check_listening(("s3cret-token",), host)  # with a token it may listen anywhere


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.5"])
def test_a_loopback_address_needs_no_token(host: str) -> None:
    check_listening((), host)


async def test_config_check_refuses_what_the_daemon_refuses(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("gateway:\n  host: 0.0.0.0\n")
    checked = await run_cli("config", "check", "--home", str(tmp_path / "home"), "--config", str(config))
    assert checked.returncode == 4, checked
    assert "refusing to listen on 0.0.0.0 without a token: set gateway.tokens" in checked.stderr
    started = await run_cli("gateway", "--home", str(tmp_path / "home"), "--config", str(config), "--port", "0",
                            env=child_env())  # fmt: skip
    assert started.returncode == 4 and "refusing to listen on 0.0.0.0 without a token" in started.stderr


def test_an_unset_model_key_variable_is_a_warning(tmp_path: Path) -> None:
    config = gateway_config(tmp_path, base_url="http://127.0.0.1:9/v1")
    warned = check_config(config, {})
    assert any(w.startswith("agents.main.model.api_key_env: OPENAI_API_KEY is not set") for w in warned), warned
    assert not any("api_key_env" in w for w in check_config(config, {"OPENAI_API_KEY": "sk-test-1"}))


@pytest.mark.parametrize("name", ["team/a", "ops#1", "a b"])
def test_an_account_name_a_webhook_route_cannot_reach_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="account name"):
        gateway_config(tmp_path, {"channels": {"telegram": {"accounts": {name: {}}}}})
    gateway_config(tmp_path, {"channels": {"telegram": {"accounts": {"team.a_1@x+y-z": {}}}}})
