"""What is new in a resent conversation: pure functions of the client's messages and what the key's
record says the client held after the last call.

OpenAI clients resend the whole conversation on every call. Each message is reduced to what a
client keeps faithfully (role, text, tool calls, tool call id) and chained into a digest, so that
"the first n messages are the ones we saw" is one comparison. The record of a key keeps the
digest of the conversation as the client sent it last (``request``) and with our answer appended
(``answered``); ``base`` is where that call's new messages started.

- the history continues the answered one: store the messages after it;
- it is the last request again (a retry): its answer is replayed from the record; when it was
  stored but not answered (the model failed), its new messages are posted again and the turn
  runs again;
- it carries no assistant message (a client that sends only the new message): all of it is new;
- anything else (an edited or dropped earlier message, another chat of the same user): the
  conversation diverged; the caller starts a new run holding the client's whole history.

Every posted message carries ``Plan.client_message_id`` (the epoch and the digest up to it), so
posting one again (a retry, a call resent after a crash whose record was never saved) stores
nothing: the record may lag the durable appends but the ids make the resend land on them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sessions.records import CompatConversation

_SEED = hashlib.sha256(b"neotask-openai-conversation-v1").hexdigest()

Role = Literal["user", "assistant", "tool"]


@dataclass(frozen=True)
class ChatMessage:
    """One conversation message of a client (system and developer messages are not part of it)."""

    role: Role
    content: str
    name: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str | None = None

    def identity(self) -> str:
        calls = [[c["id"], c["function"]["name"], c["function"]["arguments"]] for c in self.tool_calls]
        return json.dumps([self.role, self.content.strip(), calls, self.tool_call_id or ""], ensure_ascii=False)


# What the key's client held after its last call (table ``openai_conversations``): the store's record.
Record = CompatConversation


@dataclass(frozen=True)
class Plan:
    """``kind``: ``continue`` | ``retry`` | ``fresh`` (no record, or no history sent) | ``diverged``.
    ``start``: index of the first message to post; ``epoch``: for the client message ids."""

    kind: Literal["continue", "retry", "fresh", "diverged"]
    start: int
    epoch: int
    digests: tuple[str, ...]  # digests[i] covers messages[:i]

    @property
    def new_run(self) -> bool:
        return self.kind == "diverged"

    def client_message_id(self, index: int) -> str:
        """The id of message ``index``: the same message of the same conversation gets the same id."""
        return f"openai:{self.epoch}:{self.digests[index + 1][:40]}"


def chain(digest: str, message: ChatMessage) -> str:
    return hashlib.sha256(f"{digest}\n{message.identity()}".encode()).hexdigest()


@dataclass(frozen=True)
class Known:
    """A conversation whose digests are computed already (the key's last one, kept in memory): a
    resent history that starts with the same messages reuses them instead of hashing each message
    again on every call."""

    messages: tuple[ChatMessage, ...]
    digests: tuple[str, ...]  # digests[i] covers messages[:i]

    def extended(self, message: ChatMessage, digest: str) -> Known:
        return Known((*self.messages, message), (*self.digests, digest))


def digests(messages: Sequence[ChatMessage], known: Known | None = None) -> tuple[str, ...]:
    """The chained digests of ``messages``; those of the prefix ``known`` shares with them are
    taken from it (equal messages have equal identities, so equal digests)."""
    same = 0
    if known is not None:
        limit = min(len(known.messages), len(messages))
        while same < limit and known.messages[same] == messages[same]:
            same += 1
    out = list(known.digests[: same + 1]) if known is not None else [_SEED]
    for message in messages[same:]:
        out.append(chain(out[-1], message))
    return tuple(out)


def plan(messages: Sequence[ChatMessage], record: Record | None, known: Known | None = None) -> Plan:
    """Which of ``messages`` to store (``messages[start:]``), and whether a new run is needed."""
    chained = digests(messages, known)
    n = len(messages)
    if record is None:
        return Plan("fresh", 0, 0, chained)
    if n == record.request_count and chained[n] == record.request_digest and record.base_count < n:
        return Plan("retry", record.base_count, record.epoch, chained)
    if n > record.answered_count and chained[record.answered_count] == record.answered_digest:
        return Plan("continue", record.answered_count, record.epoch, chained)
    if not any(m.role == "assistant" for m in messages):
        return Plan("fresh", 0, record.epoch + 1, chained)
    return Plan("diverged", 0, record.epoch + 1, chained)


def input_ids(previous_response_id: str | None, messages: Sequence[ChatMessage]) -> list[str | None]:
    """The ids of a Responses call's input items: derived from the response they continue, their
    place and their content (``None`` each without a previous response: nothing anchors them)."""
    if previous_response_id is None:
        return [None] * len(messages)
    chained = digests(messages, None)
    anchor = hashlib.sha256(previous_response_id.encode()).hexdigest()[:16]
    return [f"openai-resp:{anchor}:{chained[i + 1][:40]}" for i in range(len(messages))]


def after_request(p: Plan, count: int) -> Record:
    """The record once the request's messages are stored (before the answer)."""
    return Record(p.epoch, p.start, count, p.digests[count], count, p.digests[count])


def after_answer(record: Record, answer: ChatMessage, saved: str | None = None) -> Record:
    """The record once ``answer`` went back to the client: its next call continues from here;
    ``saved`` is the answer as a retry of the call gets it again."""
    return Record(
        record.epoch,
        record.base_count,
        record.request_count,
        record.request_digest,
        record.request_count + 1,
        chain(record.request_digest, answer),
        saved,
    )
