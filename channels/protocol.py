"""The contract between a chat connector and the gateway that wires it.

A connector turns platform updates into :class:`Inbound` messages and hands each one to the
gateway's post function, which returns once the message is durable (so a connector acknowledges
the platform only then). Replies come back as text the connector renders into platform parts
(``render``) and sends one part at a time (``send_part``); a send the platform did not accept
raises :class:`RetryLater` or :class:`Rejected`. A connector the platform calls over HTTP
(Telegram's webhook, Slack's Events API) also takes those calls (``receive``): the gateway's route
hands it the raw body and headers and renders the JSON answer it returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from config.channels import ChatAccount
from config.redaction import SECRETS

ChatType = Literal["direct", "group", "channel"]


@dataclass(frozen=True)
class Target:
    """Where a reply goes: the chat, its topic or thread, and the message it answers."""

    chat_id: str
    thread_id: str | None = None
    reply_to: str | None = None


Revision = Literal["edit", "delete"]


@dataclass(frozen=True)
class Inbound:
    """One platform message, as the session engine takes it. ``update_id`` is the platform's id of
    the delivery; ``reply``: whether the message asks for an answer (false for a group message that
    does not mention the bot but is stored anyway). ``message_id``: the platform's id of the
    message in its chat (Telegram's message_id, Slack's ts). ``revision``: the message is an edit
    or a deletion of the message ``message_id``; ``text`` is then the new text, and ``reply``
    whether that text addresses the bot (channels/revisions.py decides what is stored)."""

    channel: str
    account: str
    agent: str
    chat_type: ChatType
    chat_id: str
    sender_id: str
    text: str
    update_id: str
    target: Target
    sender_name: str | None = None
    thread_id: str | None = None
    reply: bool = True
    message_id: str | None = None
    revision: Revision | None = None

    @property
    def client_message_id(self) -> str:
        return f"{self.channel}:{self.account}:{self.update_id}"

    @property
    def content(self) -> str:
        """The message as the session stores it: an edit or a deletion says which message it changes."""
        if self.revision == "edit":
            return f"[edited message {self.message_id}] {self.text}"
        if self.revision == "delete":
            return f"[deleted message {self.message_id}]"
        return self.text

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Inbound:
        return cls(**{**data, "target": Target(**data["target"])})


@dataclass(frozen=True)
class Skip:
    """A platform update that becomes no message, and why (logged at debug level)."""

    reason: str


def heard(channel: str, account_name: str, account: ChatAccount, **message: Any) -> Inbound | Skip:
    """A platform's message for the account's agent; a ``Skip`` for a new message outside a
    direct chat that does not ask for an answer where the account does not store those
    (``store_unmentioned``). Edits and deletions always go on (channels/revisions.py decides)."""
    inbound = Inbound(channel=channel, account=account_name, agent=account.agent, **message)
    if inbound.reply or inbound.chat_type == "direct" or inbound.revision is not None or account.store_unmentioned:
        return inbound
    return Skip(f"a {inbound.chat_type} message that does not mention the bot")


PostFn = Callable[[Inbound], Awaitable[None]]


class RetryLater(Exception):
    """The platform did not take the send now (network, 5xx, 429); ``retry_after`` in seconds
    when the platform said how long to wait."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Rejected(Exception):
    """The platform refused the send for good (blocked by the user, chat gone)."""


@dataclass
class AccountStatus:
    """What ``neotask channels status`` and ``GET /v1/channels`` show for one account. ``restarts``:
    how often its connector stopped for a reason it does not handle and was started again."""

    channel: str
    account: str
    agent: str
    mode: str
    enabled: bool = True
    connected: bool = False
    username: str | None = None
    last_update_at: str | None = None
    last_error: str | None = None
    messages_in: int = 0
    messages_out: int = 0
    restarts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The account as the API and the CLI show it, every secret hidden (an error may quote a
        library's URL that holds the token)."""
        data = asdict(self)
        data.pop("extra")
        return {k: SECRETS(v) if isinstance(v, str) else v for k, v in {**data, **self.extra}.items()}


class Pairings(Protocol):
    """What reaches a running connector of an approval or a revoke made through the API
    (``channels/access.py``'s ``DirectAccess``)."""

    async def welcome(self) -> set[str]:
        """Tell the approved senders not yet told; the codes told now."""

    def forget(self, sender_id: str) -> None:
        """A revoked sender is a stranger again."""


class Connector(Protocol):
    """One account of one platform."""

    channel: str
    account: str
    status: AccountStatus

    @property
    def access(self) -> Pairings:
        """The account's direct-chat gate (its pairings)."""

    async def start(self, post: PostFn) -> None:
        """Connect and begin handing messages to ``post``; returns at once (the connector runs in
        its own task). A refused token is logged in one line and recorded in ``status``."""

    def render(self, markdown: str) -> list[str]:
        """A reply in the platform's format, split into the parts it accepts."""

    async def send_part(self, target: Target, part: str) -> None:
        """Send one rendered part; raises RetryLater or Rejected when the platform did not take it."""

    async def typing(self, target: Target) -> None:
        """Show that an answer is being written (best effort)."""

    async def notify(self, target: Target, text: str) -> bool:
        """Send a plain notice outside the outbox (a pairing code, an approval); best effort:
        whether the platform took it (a failure is logged)."""

    async def stop(self) -> None:
        """Stop taking updates and close the connection."""

    @property
    def takes_calls(self) -> bool:
        """Whether the platform calls the gateway for this account (``receive``) instead of the
        connector fetching updates or holding a socket."""

    async def receive(self, body: bytes, headers: Mapping[str, str]) -> dict[str, Any] | None:
        """One call from the platform: checked (its secret or signature), and answered once its
        message is durable (None: an empty 200, which is how a Slack slash command is only
        acknowledged); raises otherwise (InvalidSignature, BadRequest, ChannelNotReady: the
        platform retries a call not answered 2xx)."""
