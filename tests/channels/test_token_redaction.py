"""Tokens never appear in logs, API answers or pages (issue 40 item 2). A Telegram ``api_base``
without a scheme passed ``config check``, aiogram retried it for ever, and its error, which quotes
``<api_base>/bot<token>/getMe``, went to ``logs/gateway.log``, ``GET /v1/channels`` and the console.
Now channel URLs need a scheme, and every secret the gateway reads is hidden wherever text leaves
it: the log handler's filter and the account status."""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import pytest

from channels.protocol import AccountStatus
from config.errors import ConfigError
from config.redaction import SECRETS, Redactor
from gateway.log_json import JsonFormatter
from gateway.logs import RedactFilter
from tests.conftest import FakeClock
from tests.gateway.helpers import gateway_config, make_app

TOKEN = "7012345678:AAHk2tqYo-Tv1cJ0Ck9vXjPp3rYq4Zt8W_c"  # the shape of a real Bot API token
LEAK = f"Cannot connect to host 127.0.0.1:8081/bot{TOKEN}/getMe ssl:default [Connect call failed]"


@pytest.mark.parametrize(
    ("platform", "field", "value"),
    [
        ("telegram", "api_base", "127.0.0.1:8081"),
        ("telegram", "api_base", "api.telegram.org"),
        ("telegram", "webhook_url", "bot.example.org/hooks/telegram/main"),
        ("slack", "api_base", "slack-gov.com/api/"),
        ("slack", "api_base", "ftp://slack.example.org/api/"),
    ],
)
def test_a_channel_url_without_an_http_scheme_is_refused_by_the_config_check(
    tmp_path: Path, platform: str, field: str, value: str
) -> None:
    account: dict[str, Any] = {field: value}
    if field == "webhook_url":
        account.update(mode="webhook", webhook_secret_env="TG_SECRET")
    with pytest.raises(ConfigError) as refused:
        gateway_config(tmp_path, {"channels": {platform: {"accounts": {"main": account}}}})
    assert field in refused.value.message and "is not an http:// or https:// URL" in refused.value.message


def test_every_registered_secret_and_any_bot_api_token_in_a_url_are_hidden() -> None:
    redact = Redactor()
    redact.add(["xoxb-1234-secret", None, "", "short"])  # nothing shorter than 6: it would hide words
    assert redact("token xoxb-1234-secret refused") == "token *** refused"
    assert redact("a short word") == "a short word"
    unknown = "GET /bot1234567:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA/getUpdates"  # never registered
    assert redact(unknown) == "GET /bot***/getUpdates"


def test_the_daemon_s_log_filter_hides_tokens_in_messages_arguments_and_tracebacks() -> None:
    redact = Redactor()
    redact.add([TOKEN])
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactFilter(redact))
    logger = logging.getLogger("test.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.error("telegram account main: %s", LEAK)
        try:
            raise ConnectionError(LEAK)
        except ConnectionError:
            logger.exception("polling failed for token %s", TOKEN)
    finally:
        logger.removeHandler(handler)
    written = out.getvalue()
    assert TOKEN not in written and "7012345678:" not in written, written
    assert written.count("/bot***/getMe") == 2 and "polling failed for token ***" in written


async def test_the_account_status_served_by_the_api_hides_the_token(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    account = {"token_env": "TG_LEAK", "api_base": "http://127.0.0.1:9", "enabled": True}
    app = make_app(tmp_path, clock, {"channels": {"telegram": {"accounts": {"main": account}}}}, env={"TG_LEAK": TOKEN})
    client = await aiohttp_client(app)  # the intake registers the token it reads from the environment
    assert SECRETS(f"bot{TOKEN}") == "bot***"
    status = AccountStatus("telegram", "main", "main", "polling", last_error=f"getMe failed: {LEAK}")
    assert TOKEN not in str(status.as_json()) and "/bot***/getMe" in status.as_json()["last_error"]
    answer = await (await client.get("/v1/channels")).text()
    assert TOKEN not in answer
