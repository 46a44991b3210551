"""The OpenAI-compatible front door's logic: which agent and session a call goes to, what of a
resent conversation is new, storing it through ``Conversations`` and answering.

Session selection (docs/openai-compat.md): the ``X-Neotask-Session-Key`` header names the key;
else ``user`` is the peer of a direct key ``agent:<id>:openai:dm:<user>`` (channel ingress rules,
always per channel and peer: a shared default would mix strangers' chats); else the call is
stateless: a one-off ``hook:openai:<uuid>`` run, completed once the answer is out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from config.clock import Clock
from config.errors import (
    BadRequest,
    Busy,
    ModelNotFound,
    ProviderFailure,
    ResponseNotFound,
    ResponseNotLatest,
)
from conversations.commands import Commands, dispatch
from conversations.run_end import RunEnd, end_run
from conversations.turns import Outcome, Post, TurnOptions
from gateway.openai_compat import history
from gateway.openai_compat.history import ChatMessage, Plan
from gateway.openai_compat.records import CompatRecords, ResponseRef
from sessions.keys import Ingress, SessionKey, hook_key, parse_key, route
from sessions.records import NewMessage

log = logging.getLogger(__name__)

DeltaFn = Callable[[str], Awaitable[None]]
MODEL_PREFIX = "neotask/"
KNOWN_KEYS = 256  # conversations kept in memory with their digests (a resent history reuses them)
CHANNEL = "openai"


@dataclass(frozen=True)
class Target:
    """Where a call goes: the key, and whether it is a stateless one-off run."""

    key: SessionKey
    stateless: bool = False
    user: str | None = None


@dataclass
class Answer:
    """What the agent answered, for the route to shape."""

    session_key: str
    outcome: Outcome
    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    new_run: bool = False
    previous_run_id: str | None = None

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"

    def message(self) -> ChatMessage:
        return ChatMessage("assistant", self.content, tool_calls=tuple(self.tool_calls))


@dataclass
class Progress:
    """Known before the answer (a streamed answer sends its headers with the first delta)."""

    new_run: bool = False
    previous_run_id: str | None = None


@dataclass(frozen=True)
class Call:
    """One call's messages and per-call turn options."""

    target: Target
    instructions: str | None
    messages: Sequence[ChatMessage]
    client_tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] | None = None
    previous_response_id: str | None = None  # Responses: what the input continues


class OpenAICompat:
    def __init__(self, commands: Commands, *, clock: Clock, crash_step: Callable[[str], None] | None = None) -> None:
        self.commands = commands
        self._step = crash_step or _no_step  # gateway/crashpoints.py (tests kill the daemon there)
        self.conv = commands.conv
        self.store = commands.store
        self.settings = commands.conv.settings
        self.records = CompatRecords(self.store)
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._known: OrderedDict[str, history.Known] = OrderedDict()  # the last conversations, by key

    # -- selection ------------------------------------------------------------------------------

    def agent_for(self, model: str) -> str:
        """``neotask/<agent>`` or a bare agent id; anything else is 404 ``model_not_found``."""
        agent_id = model.removeprefix(MODEL_PREFIX)
        if agent_id not in self.settings.agents:
            listed = ", ".join(MODEL_PREFIX + a for a in self.settings.agents)
            raise ModelNotFound(f"the model {model!r} does not exist; GET /v1/models lists: {listed}", param="model")
        return agent_id

    def own_tools(self) -> set[str]:
        return {t["function"]["name"] for t in self.conv.tools.schemas()}

    def target(self, agent_id: str, *, header_key: str | None, user: str | None) -> Target:
        agents = self.settings.agents
        if header_key:
            key = parse_key(header_key, agents=agents)
            if key.agent_id is None:  # cron: and hook: keys name no agent: the model's runs them
                key = replace(key, agent_id=agent_id)
            elif key.agent_id != agent_id:
                raise BadRequest(f"the session key belongs to agent {key.agent_id!r} but model selects {agent_id!r};"
                                 f" use model neotask/{key.agent_id}", field="model")  # fmt: skip
            return Target(key, user=user)
        if user:
            ingress = Ingress(CHANNEL, "direct", user, user, None, agent_id)
            return Target(route(ingress, dm_scope="per-channel-peer", bindings=(), agents=agents), user=user)
        key = parse_key(hook_key(CHANNEL, uuid.uuid4().hex), agents=agents)
        return Target(replace(key, agent_id=agent_id), stateless=True)

    @contextlib.asynccontextmanager
    async def _locked(self, key: str, *, forget: bool, agent_id: str | None = None) -> Any:
        """One call per key at a time (the history check and the store must not interleave); more
        than the agent's ``max_queued_turns`` calls waiting is 429 ``session_busy``."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        limit = self.conv.agent(agent_id).max_queued_turns
        if lock.locked() and self._waiting.get(key, 0) >= limit:
            raise Busy(f"session {key!r} already has {limit} calls waiting (max_queued_turns); retry later",
                       retry_after_s=1)  # fmt: skip
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            await lock.acquire()
        finally:
            self._waiting[key] -= 1
            if self._waiting[key] == 0:
                del self._waiting[key]
        try:
            yield
        finally:
            lock.release()
            if forget and not lock.locked():
                self._locks.pop(key, None)

    @contextlib.asynccontextmanager
    async def erasing(self, key: str) -> AsyncIterator[None]:
        """Hold ``key`` against calls of these routes while it is purged (a call half done would
        write its conversation record back), then forget what this process keeps of the key in
        memory: its record, with the last answer a retry would get, and its digests."""
        async with self._locks.setdefault(key, asyncio.Lock()):
            try:
                yield
            finally:
                self._known.pop(key, None)
                self.records.forget(key)

    # -- chat completions -----------------------------------------------------------------------

    async def chat(self, call: Call, *, on_delta: DeltaFn | None = None, progress: Progress | None = None) -> Answer:
        """Store what is new of a resent conversation and answer its last message."""
        key = call.target.key.raw
        progress = progress or Progress()
        if call.target.stateless:
            self.conv.one_off.add(key)
        try:
            async with self._locked(key, forget=call.target.stateless, agent_id=call.target.key.agent_id):
                record = None if call.target.stateless else await self.records.conversation(key)
                plan = history.plan(call.messages, record, self._known.get(key))
                if plan.kind == "retry" and record is not None and record.answer is not None:
                    return _replayed(key, record.answer)
                if plan.new_run and await self._started(key, plan):
                    progress.new_run = True  # a diverged call cut short (a crash) started this run already
                elif plan.new_run:
                    progress.new_run, progress.previous_run_id = True, await self._end_run(key)
                answer = await self._store_and_answer(call, plan, on_delta, track=not call.target.stateless)
                answer.new_run, answer.previous_run_id = progress.new_run, progress.previous_run_id
        finally:
            if call.target.stateless:  # answered or failed, a one-off run ends
                self._end_later(key)
        return answer

    async def _store_and_answer(self, call: Call, plan: Plan, on_delta: DeltaFn | None, *, track: bool) -> Answer:
        """Post the new messages and answer the last; then save the record with the answer (one
        tasks.db write per call).

        Each message carries the id of its place in the conversation (``plan.client_message_id``:
        epoch, the digest of everything up to it), scoped to the run (``Post.id_scope``): one the
        run holds already is not stored again, and a last message already answered gets its stored
        answer. So the record may lag the durable appends (a crash between them, a failed turn)
        but never lead them: a call resent after a crash computes the same plan from the same
        record and finds what it had stored by these ids. A retry posts its messages again the
        same way."""
        key = call.target.key.raw
        messages = call.messages
        last = len(messages) - 1
        names = {c["id"]: c["function"]["name"] for m in messages for c in m.tool_calls}
        unanswered = _unanswered(messages, plan.start)
        for index in range(plan.start, last + 1):
            if unanswered and messages[index].role != "tool":
                before = plan.client_message_id(plan.start - 1)
                for call_id in unanswered:  # the model needs a result for every call it made
                    stand_in = self._post(call, _NO_RESULT, reply=False, cmid=f"{before}:{call_id}", names=names,
                                          tool_call_id=call_id)  # fmt: skip
                    await self.conv.post(stand_in)
                    self._step("openai:message-stored")
                unanswered = []
            if index < last:
                await self.conv.post(self._post(call, messages[index], reply=False, cmid=plan.client_message_id(index),
                                                names=names))  # fmt: skip
                self._step("openai:message-stored")
        record = history.after_request(plan, len(messages))
        post = self._post(call, messages[last], reply=True, cmid=plan.client_message_id(last), names=names)
        try:
            outcome = await dispatch(self.commands, post, on_delta=on_delta)
        except ProviderFailure as exc:
            # Stored, not answered: the retry of this call posts the same ids and runs the turn again.
            if track and isinstance(exc.extra.get("message_seq"), int):
                await self.records.save_conversation(key, record)
            raise
        self._step("openai:answer-stored")
        answer = _answer(key, outcome)
        if track:
            saved = json.dumps(outcome.body(), ensure_ascii=False)
            answered = history.after_answer(record, answer.message(), saved)
            await self.records.save_conversation(key, answered)
            self._step("openai:record-saved")
            self._remember(key, history.Known(tuple(messages), plan.digests), answer, answered.answered_digest)
        return answer

    async def _started(self, key: str, plan: Plan) -> bool:
        """Whether the key's active run holds the first message of ``plan``'s diverged
        conversation by its id already: the run a diverged call started before it was cut short
        (its record never saved), which the resent call continues instead of ending."""
        return await self.store.find_delivery(key, plan.client_message_id(0), since="") is not None

    def _remember(self, key: str, request: history.Known, answer: Answer, digest: str) -> None:
        """Keep the key's conversation as its client now holds it (the request and the answer),
        for the next call's digests; the least recently used keys beyond ``KNOWN_KEYS`` go."""
        self._known[key] = request.extended(answer.message(), digest)
        self._known.move_to_end(key)
        while len(self._known) > KNOWN_KEYS:
            self._known.popitem(last=False)

    def _post(
        self,
        call: Call,
        message: ChatMessage,
        *,
        reply: bool,
        cmid: str | None,
        names: dict[str, str],
        tool_call_id: str | None = None,
    ) -> Post:
        options = None
        if reply:
            options = TurnOptions(
                instructions=call.instructions,
                client_tools=call.client_tools,
                tool_choice=call.tool_choice,
                answer_tool=message.role == "tool",
            )
        return Post(
            id_scope="run",
            key=call.target.key,
            message=NewMessage(
                role=message.role,
                content=message.content,
                name=message.name,
                sender_id=call.target.user,
                tool_name=names.get(tool_call_id or message.tool_call_id or ""),
                tool_call_id=tool_call_id or message.tool_call_id,
                client_message_id=cmid,
                tool_calls=message.tool_calls,
            ),
            reply=reply,
            options=options,
        )

    async def _end_run(self, key: str) -> str | None:
        """A diverged conversation: complete the key's run; the next one starts from the client's
        history alone (no inherited summary: the client resends what it wants the agent to see)."""
        async with self.conv.exclusive(key):
            ended = await end_run(self.conv, key, RunEnd("openai-diverged"))
            await self.store.set_inherit_next(key, False)
            return ended[0].run_id if ended is not None else None

    def _end_later(self, key: str) -> None:
        """A stateless call's run is completed after the answer went out, off the request's path,
        without a final summary: no later run of its key can inherit it (the key is new per call
        and forgotten now), so the model is not asked for one."""

        async def end() -> None:
            try:
                async with self.conv.exclusive(key):
                    await end_run(self.conv, key, RunEnd("openai-stateless", summarize=False))
                    if self.store.entry(key) is not None:
                        await self.store.delete(key)
            except Exception:  # a background job has no caller to answer: log it
                log.exception("completing the one-off run of %s failed", key)
            finally:
                self.conv.one_off.discard(key)

        task = asyncio.create_task(end())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Let pending one-off completions finish."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # -- responses ------------------------------------------------------------------------------

    async def previous(self, response_id: str) -> ResponseRef:
        ref = await self.records.response(response_id)
        if ref is None:
            raise ResponseNotFound(
                f"no stored response {response_id!r} (responses made with store: false are not kept)",
                param="previous_response_id",
            )
        latest = await self.records.latest_response(ref.session_key)
        if latest != response_id:
            raise ResponseNotLatest(
                f"response {response_id!r} is not the latest of its session ({latest}); continuing from an"
                " earlier response (a fork) is not supported",
                param="previous_response_id",
            )
        return ref

    async def respond(
        self, call: Call, *, store: bool, on_delta: DeltaFn | None = None, response_id: str | None = None
    ) -> tuple[Answer, str]:
        """Post the input items (all new) and answer; ``(answer, response id)``. The id is kept
        (mapped to its key and seq) when ``store``; a stateless call's run ends after it unless
        it is stored (its id continues it)."""
        key = call.target.key.raw
        response_id = response_id or f"resp_{uuid.uuid4().hex}"
        if call.target.stateless and not store:
            self.conv.one_off.add(key)
        try:
            async with self._locked(key, forget=call.target.stateless, agent_id=call.target.key.agent_id):
                answer = await self._post_all(call, on_delta)
                if store:
                    seq = answer.outcome.reply.get("seq") if answer.outcome.reply else answer.outcome.message_seq
                    run_id = answer.outcome.run_id
                    await self.records.save_response(ResponseRef(response_id, key, run_id, seq))
                    self._step("openai:record-saved")
        except BaseException:
            if call.target.stateless:  # no id continues it: the one-off run ends
                self._end_later(key)
            raise
        if call.target.stateless and not store:
            self._end_later(key)
        return answer, response_id

    async def _post_all(self, call: Call, on_delta: DeltaFn | None) -> Answer:
        """Every message of the call is new (Responses input items): post them, answer the last.
        Input that continues a response carries ids derived from that response id, its place and
        its content: the same call resent (after a crash, before its own response id was kept)
        stores nothing again and gets the stored answer, as a resent chat completion does."""
        key = call.target.key.raw
        messages = call.messages
        names = {c["id"]: c["function"]["name"] for m in messages for c in m.tool_calls}
        ids = history.input_ids(call.previous_response_id, messages)
        for index in range(len(messages) - 1):
            await self.conv.post(self._post(call, messages[index], reply=False, cmid=ids[index], names=names))
            self._step("openai:message-stored")
        post = self._post(call, messages[-1], reply=True, cmid=ids[-1], names=names)
        answer = _answer(key, await dispatch(self.commands, post, on_delta=on_delta))
        self._step("openai:answer-stored")
        return answer


def _no_step(name: str) -> None:
    pass


_NO_RESULT = ChatMessage("tool", "error: the client did not return a result for this call")


def _unanswered(messages: Sequence[ChatMessage], start: int) -> list[str]:
    """Ids of the client tool calls in the message just before the new ones that no new message
    answers: the client moved on without running them. Each gets a stand-in result, or the stored
    context would hold a call without its result, which models refuse."""
    if start == 0 or not messages[start - 1].tool_calls:
        return []
    answered = {m.tool_call_id for m in messages[start:] if m.role == "tool"}
    return [c["id"] for c in messages[start - 1].tool_calls if c["id"] not in answered]


def _replayed(key: str, saved: str) -> Answer:
    body = json.loads(saved)
    outcome = Outcome(key, body.get("run_id"), body.get("message_seq"), body.get("reply"), [], body.get("usage") or {})
    return _answer(key, outcome)


def _answer(key: str, outcome: Outcome) -> Answer:
    reply: Mapping[str, Any] = outcome.reply or {}
    calls = [dict(c) for c in reply.get("tool_calls") or ()]
    return Answer(key, outcome, str(reply.get("content") or ""), calls)
