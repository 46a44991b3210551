"""What is posted to a key and what a post answers (SPEC section 8): ``Post``, ``Outcome``,
``TurnOptions``, and the message shapes the model is sent."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

from conversations.completions import Usage
from sessions.events import TurnEvent
from sessions.keys import SessionKey
from sessions.records import NewMessage, TaskKey

DeltaFn = Callable[[str], Awaitable[None]]
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
NAME_MAX = 64


@dataclass(frozen=True)
class TurnOptions:
    """Per-call additions to a model turn (the OpenAI-compatible routes): extra system
    ``instructions`` after the agent's prompt, the client's own function ``client_tools`` (a call
    to one ends the turn and is handed back to the client) and ``tool_choice``; ``answer_tool``:
    a ``role: tool`` post (a client tool's result) gets a model turn like a user message."""

    instructions: str | None = None
    client_tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] | None = None
    answer_tool: bool = False

    @property
    def client_tool_names(self) -> frozenset[str]:
        return frozenset(str(t.get("function", {}).get("name", "")) for t in self.client_tools)


@dataclass(frozen=True)
class Post:
    """A message to post to a key, as the routes build it: the ``message`` the store keeps (the
    engine stores it as given, but for the speaker's name made OpenAI-safe), and its routing:
    ``reply`` (False: store it, no turn), the run's ``task_key`` when the post starts one, the
    per-call ``options`` and the scope of its ``client_message_id``."""

    key: SessionKey
    message: NewMessage
    reply: bool = True
    task_key: TaskKey | None = None
    options: TurnOptions | None = None
    # ``key``: a client_message_id is recognised on the key within the idempotency window (its
    # record in tasks.db, else the transcript); ``run``: it names a place in the active run's
    # conversation (the OpenAI routes' derived ids) and is recognised from that run's transcript
    # alone, at any age, with no record written
    id_scope: Literal["key", "run"] = "key"


class Reply(TypedDict):
    """The model's (or a command's) answer in a reply body: its text and the seq it was stored at
    (None when nothing was stored); ``tool_calls`` when the turn ends on calls the client runs."""

    content: str
    seq: int | None
    tool_calls: NotRequired[list[dict[str, Any]]]


class ReplyBody(TypedDict):
    """What ``POST /v1/messages`` and the session routes answer, a redelivery replays, a webhook
    or cron job delivers to ``deliver_to`` (SPEC section 8)."""

    session_key: str
    run_id: str | None
    message_seq: int | None
    reply: Reply | None
    events: list[TurnEvent]
    usage: dict[str, int]


_NO_USAGE = Usage().as_dict()  # copied per outcome (building a Usage per message cost more)


@dataclass
class Outcome:
    """What a message or command call answers (SPEC section 8)."""

    session_key: str
    run_id: str | None
    message_seq: int | None
    reply: Reply | None = None
    events: list[TurnEvent] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=_NO_USAGE.copy)

    def body(self) -> ReplyBody:
        return {
            "session_key": self.session_key,
            "run_id": self.run_id,
            "message_seq": self.message_seq,
            "reply": self.reply,
            "events": self.events,
            "usage": self.usage,
        }


def speaker_name(name: str | None) -> str | None:
    """The speaker's name as a message stores it: OpenAI's ``name`` (``[A-Za-z0-9_-]{1,64}``,
    spaces written ``_``) when that holds it; else the name as given, its whitespace collapsed, at
    most 64 characters ("田中 太郎", "Алиса", "Zoë K."), which :func:`to_openai` puts before the
    text, where the model reads it."""
    if not name:
        return None
    spoken = " ".join(name.split())[:NAME_MAX].strip()
    safe = openai_name(spoken)
    return safe if safe is not None and safe == spoken.replace(" ", "_").strip("_") else spoken or None


def openai_name(name: str) -> str | None:
    """OpenAI's ``name`` for a speaker (``[A-Za-z0-9_-]{1,64}``): what is left once every other
    character is dropped, None when nothing is."""
    return _NAME_UNSAFE.sub("_", name.strip())[:NAME_MAX].strip("_") or None


def to_openai(line: Mapping[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": line["role"], "content": line.get("content") or ""}
    if line["role"] == "user" and line.get("name"):
        name = str(line["name"])
        safe = openai_name(name)
        if safe is not None:
            message["name"] = safe
        if safe != name:  # the name cannot hold the speaker: the text carries them
            message["content"] = f"{name}: {message['content']}"
    if line.get("tool_calls"):
        message["tool_calls"] = line["tool_calls"]
        if not message["content"]:
            message["content"] = None
    if line["role"] == "tool":
        message["tool_call_id"] = line.get("tool_call_id") or ""
    return message


def outcome_from(body: Mapping[str, Any]) -> Outcome:
    return Outcome(
        session_key=body["session_key"],
        run_id=body.get("run_id"),
        message_seq=body.get("message_seq"),
        reply=body.get("reply"),
        events=list(body.get("events") or []),
        usage=dict(body.get("usage") or {}),
    )
