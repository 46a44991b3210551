"""The Slack connector: one Slack app over Socket Mode, on slack_sdk's async clients.

Start-up: ``auth.test`` with the bot token (a refused token is one log line and the account's
``last_error``; the other accounts keep running), then the Socket Mode client opens
``apps.connections.open`` with the app-level token and listens. Each ``events_api`` envelope is
acknowledged only after its message is durable (the post function returned): an envelope not
acknowledged is delivered again by Slack, and its ``event_id`` (``slack:<account>:<event_id>``
as client_message_id) makes the second store a no-op. Replies go out with ``chat.postMessage``
in mrkdwn, to the same channel and thread.

Only an answer that refuses a token (``invalid_auth``, ``not_authed``, ``account_inactive``,
``token_revoked``...) stops the account; a 5xx, a 429, an HTML page from a proxy or a network
error at start is tried again with a backoff, and whatever else ends the connector's task is
logged and the task started again (``channels/supervisor.py``).

Slash commands (``/new``, ``/reset``, ``/compact``, ``/status``, ``/help`` registered in the app)
arrive as ``slash_commands`` envelopes, routed by a slack_bolt ``AsyncApp`` (its ``command``
listeners and ``ack``): acknowledged at once (Slack allows 3 seconds and never redelivers a
slash command), then handed on like the same command typed as a message; the answer goes to the
conversation it was typed in through the outbox.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import aiohttp
from slack_bolt.adapter.socket_mode.async_internals import run_async_bolt_app, send_async_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import Clock as SignatureClock
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from channels.account import AccountParts
from channels.handover import hand_over
from channels.protocol import Inbound, PostFn, Rejected, RetryLater, Skip, Target
from channels.revisions import Ignored
from channels.slack_events import CHANNEL, inbound, slash_inbound
from channels.slack_format import SLACK_LIMIT, split
from channels.store import ChannelStore
from channels.supervisor import MAX_BACKOFF_S, supervise
from config.channels import SlackAccount
from config.chat_commands import CHAT_COMMANDS
from config.clock import Clock, iso
from config.errors import BadRequest, ChannelNotReady, InvalidBody, InvalidSignature

log = logging.getLogger(__name__)
DEFAULT_API = "https://slack.com/api/"
SLASH_COMMANDS = tuple(f"/{c.name}" for c in CHAT_COMMANDS)  # the help's list, whole
TOKEN_REFUSALS = frozenset({
    "invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired", "not_allowed_token_type",
    "not_bearer_token", "no_permission", "missing_scope", "team_access_not_granted", "ekm_access_denied",
    "org_login_required", "two_factor_setup_required",
})  # fmt: skip
T = TypeVar("T")


class _NoTokenNotice(logging.Filter):
    """bolt reads ``SLACK_BOT_TOKEN`` from the environment and warns that the client's token wins
    (it always does here: each account has its own client)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "`token` will be unused" not in record.getMessage()


class _SlackClock(SignatureClock):
    """The gateway's clock for slack_sdk's timestamp check."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def now(self) -> float:
        return self.clock().timestamp()


class SlackConnector(AccountParts[SlackAccount]):
    """One Slack app account."""

    channel = CHANNEL

    def __init__(
        self, name: str, account: SlackAccount, bot_token: str, app_token: str, store: ChannelStore, *,
        clock: Clock, limit: int = SLACK_LIMIT, signing_secret: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(CHANNEL, name, account, store, clock=clock, limit=limit, notify=self.notify, noun="app")
        base = account.api_base or DEFAULT_API
        self.web = AsyncWebClient(token=bot_token, base_url=base if base.endswith("/") else base + "/")
        self._app_token = app_token
        self._socket: SocketModeClient | None = None
        self._bot_user: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._post: PostFn | None = None
        self._commands: set[asyncio.Task[bool]] = set()  # slash commands over HTTP, acknowledged, being handed on
        self._verifier = SignatureVerifier(signing_secret, clock=_SlackClock(clock)) if signing_secret else None
        bolt_log = logging.getLogger(f"{__name__}.bolt")
        if not any(isinstance(f, _NoTokenNotice) for f in bolt_log.filters):
            bolt_log.addFilter(_NoTokenNotice())
        self.bolt = AsyncApp(client=self.web, logger=bolt_log, request_verification_enabled=False,
                             url_verification_enabled=False, ssl_check_enabled=False)  # fmt: skip
        for command in SLASH_COMMANDS:
            self.bolt.command(command)(self._on_command)

    async def start(self, post: PostFn) -> None:
        self._post = post
        self._task = asyncio.create_task(supervise(self._run, self.status), name=f"slack {self.account}")

    def _refused(self, why: str) -> None:
        self._stop(why, f"fix {self.settings.bot_token_env} / {self.settings.app_token_env} and restart")

    async def _until_answered(self, method: str, call: Callable[[], Awaitable[T]], token: str) -> T | None:
        """``call`` tried again with a backoff until Slack answers it; None when Slack refused the
        token (``token``: which one, for the log line)."""
        backoff = 1.0
        while True:
            try:
                return await call()
            except SlackApiError as exc:
                status, error = answer_of(exc)
                if error in TOKEN_REFUSALS:
                    self._refused(f"{method} refused the {token} ({error})")
                    return None
                failure = f"{method} answered {status} {error or 'with something that is not Slack JSON'}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                failure = f"{method}: {type(exc).__name__}: {exc}"
            self.status.connected = False
            self.status.last_error = failure
            log.warning("slack account %s: %s; trying again in %.0f s", self.account, failure, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _run(self) -> None:
        bot_token = f"bot token in {self.settings.bot_token_env}"
        auth = await self._until_answered("auth.test", self.web.auth_test, bot_token)
        if auth is None:
            return
        self._bot_user = str(auth["user_id"])
        self.status.username = str(auth.get("user") or self._bot_user)
        await self.access.load()
        if self.settings.mode == "events":
            self.status.connected = True
            self.status.last_error = None
            log.info("slack account %s: connected as %s, Events API at /hooks/slack/%s", self.account,
                     self.status.username, self.account)  # fmt: skip
            return
        socket = SocketModeClient(app_token=self._app_token, web_client=self.web, logger=log)
        socket.socket_mode_request_listeners.append(self._on_request)  # type: ignore[arg-type]
        self._socket = socket

        async def connect() -> bool:
            await socket.connect()  # type: ignore[no-untyped-call]
            return True

        app_token = f"app token in {self.settings.app_token_env}"
        if not await self._until_answered("apps.connections.open", connect, app_token):
            return
        self.status.connected = True
        self.status.last_error = None
        log.info("slack account %s: connected as %s, Socket Mode", self.account, self.status.username)

    @property
    def takes_calls(self) -> bool:
        return self.settings.mode == "events"

    async def receive(self, body: bytes, headers: Mapping[str, str]) -> dict[str, Any] | None:
        """One Events API call (``/hooks/slack/<account>``): the signature is checked (slack_sdk's
        verifier: ``v0`` HMAC of the timestamp and body, timestamp within 5 minutes); a
        ``url_verification`` is answered with its challenge; an event returns once it is durable
        (else raises, and Slack retries)."""
        if self._verifier is None or not self._verifier.is_valid_request(body, dict(headers)):
            raise InvalidSignature(
                "missing, wrong or stale X-Slack-Signature / X-Slack-Request-Timestamp: the calls are signed with"
                f" the secret in {self.settings.signing_secret_env}"
            )
        if str(headers.get("Content-Type", "")).startswith("application/x-www-form-urlencoded"):
            self._command_call(body)
            return None
        try:
            payload = json.loads(body)
        except ValueError:
            raise InvalidBody("the body is not JSON") from None
        if not isinstance(payload, dict):
            raise BadRequest("the body is not a JSON object")
        if payload.get("type") == "url_verification":
            return {"challenge": payload.get("challenge")}
        if self._bot_user is None or self._post is None:
            raise ChannelNotReady(f"slack account {self.account} is not connected yet; Slack will retry")
        if payload.get("type") == "event_callback" and not await self._take(payload):
            raise ChannelNotReady("the event could not be stored now; Slack will retry")
        return {"ok": True}

    def _command_call(self, body: bytes) -> None:
        """A slash command over HTTP (form-encoded, to the same Request URL): acknowledged at once
        with an empty 200, as over Socket Mode (Slack allows 3 s and never resends a command), then
        handed on as its text; the answer goes through the outbox."""
        form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        if "command" not in form:
            raise InvalidBody("a form-encoded call that is not a slash command: Slack sends events as JSON")
        if self._bot_user is None or self._post is None:
            raise ChannelNotReady(f"slack account {self.account} is not connected yet; type the command again")
        self.status.last_update_at = iso(self.clock())
        message = slash_inbound(form, self.account, self.settings)
        if isinstance(message, Skip):
            raise BadRequest(f"not a slash command this app takes: {message.reason}")
        task = asyncio.create_task(self._hand_on(message))
        self._commands.add(task)
        task.add_done_callback(self._commands.discard)

    async def _on_request(self, client: SocketModeClient, request: SocketModeRequest) -> None:
        if request.type == "slash_commands":
            await send_async_response(client, request, await run_async_bolt_app(self.bolt, request), 0.0)
            return
        if request.type != "events_api":
            await client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))
            return
        if await self._take(request.payload):
            await client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))

    async def _on_command(self, ack: AsyncAck, command: dict[str, Any]) -> None:
        """A slash command (bolt's listener): acknowledged now, then handed on as its text."""
        await ack()
        self.status.last_update_at = iso(self.clock())
        message = slash_inbound(command, self.account, self.settings)
        if isinstance(message, Skip):
            log.info("slack account %s: slash command skipped: %s", self.account, message.reason)
            return
        await self._hand_on(message)

    async def _take(self, payload: dict[str, Any]) -> bool:
        """Hand one event on; True once it needs no further delivery (stored, or skipped)."""
        assert self._bot_user is not None and self._post is not None
        self.status.last_update_at = iso(self.clock())
        parsed = inbound(payload, self.account, self.settings, self._bot_user)
        message = parsed if isinstance(parsed, Skip) else await self.revisions.check(parsed)
        if isinstance(message, Skip | Ignored):
            log.debug("slack account %s: event skipped: %s", self.account, message.reason)
            return True
        return await self._hand_on(message)

    async def _hand_on(self, message: Inbound) -> bool:
        """False: not stored now; Slack delivers the event again (it was not acknowledged)."""
        assert self._post is not None
        return await hand_over(message, self._post, access=self.access, revisions=self.revisions,
                               status=self.status, what=f"slack account {self.account}: event")  # fmt: skip

    def render(self, markdown: str) -> list[str]:
        return split(markdown, self.limit)

    async def send_part(self, target: Target, part: str) -> None:
        try:
            await self.web.chat_postMessage(channel=target.chat_id, text=part, thread_ts=target.thread_id, mrkdwn=True)
        except SlackApiError as exc:
            status, error = answer_of(exc)
            if status == 429 or error == "ratelimited":
                retry = exc.response.headers.get("Retry-After") or exc.response.headers.get("retry-after")
                raise RetryLater(f"slack: {error}", float(retry) if retry else None) from None
            if status >= 500 or error in ("internal_error", "fatal_error", "service_unavailable"):
                raise RetryLater(f"slack: {status} {error}") from None
            raise Rejected(f"slack: {error}") from None
        except (TimeoutError, OSError) as exc:
            raise RetryLater(f"slack: {type(exc).__name__}: {exc}") from None
        self.status.messages_out += 1

    async def typing(self, target: Target) -> None:
        """Slack shows no typing indicator for apps over the Web API: nothing to do."""

    async def notify(self, target: Target, text: str) -> bool:
        try:
            await self.web.chat_postMessage(channel=target.chat_id, text=text, thread_ts=target.thread_id)
        except (SlackApiError, TimeoutError, OSError) as exc:
            log.warning("slack account %s: notice to %s not sent: %s", self.account, target.chat_id, exc)
            return False
        return True

    async def stop(self) -> None:
        for command in list(self._commands):  # a shutdown stops them before they are stored: as over Socket Mode
            command.cancel()
        await asyncio.gather(*self._commands, return_exceptions=True)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._socket is not None:
            await self._socket.close()  # type: ignore[no-untyped-call]
        if self.web.session is not None and not self.web.session.closed:
            await self.web.session.close()
        self.status.connected = False


def answer_of(exc: SlackApiError) -> tuple[int, str | None]:
    """The HTTP status and Slack's error code of a call that failed; the code is None when the
    answer was not Slack's JSON (a proxy's HTML page). slack_sdk holds its own response, or
    aiohttp's when a JSON content type came with a body that is not JSON."""
    response = exc.response
    status = getattr(response, "status_code", None) or getattr(response, "status", None)
    data = getattr(response, "data", None)
    error = data.get("error") if isinstance(data, dict) else None
    return (status if isinstance(status, int) else 0), (error if isinstance(error, str) else None)
