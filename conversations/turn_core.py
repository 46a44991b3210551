"""The conversation engine's shared state and configuration (``ConversationCore``): one object the
parts hold (``conversations/idempotency.py``, ``conversations/compaction_triggers.py``,
``conversations/model_turn.py``), which ``conversations/turns.py`` (``Conversations``: posting and
per-key order) builds and composes them over."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from config.clock import Clock
from config.errors import NoActiveRun
from config.settings import AgentSettings, QueueMode, Settings
from conversations.completions import Completion
from conversations.events import EventHub
from conversations.fallbacks import ModelChain
from conversations.hooks import ConversationHooks
from conversations.metrics import Metrics
from conversations.posts import Post
from conversations.queueing import QUEUE_MODES
from conversations.summarizer import ModelSummarizer
from conversations.tools import ToolBox
from sessions.compactor import Compactor
from sessions.protocol import ConversationStore, TurnLocks
from sessions.records import MessageRecord, NewMessage, RunState
from sessions.thresholds import compaction_threshold
from sessions.tokens import estimate_text

log = logging.getLogger(__name__)


@dataclass(eq=False)
class ConversationCore:
    """The state of the conversation engine that its parts share (idempotency, compaction
    triggers, model turns, and the posting ``Conversations`` composes them in), and what every
    part reads: the agent's settings, provider and model, the per-key turn locks, the context
    overhead, usage accounting."""

    store: ConversationStore
    settings: Settings
    providers: Mapping[str, ModelChain]
    hub: EventHub
    metrics: Metrics
    clock: Clock
    tools: ToolBox
    hooks: ConversationHooks
    # keys of one-off runs nothing can inherit (a stateless OpenAI-compatible call): no memory
    # flush saves their facts, and they end without a final summary
    one_off: set[str] = field(default_factory=set)
    turn_locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    compactors: dict[str, Compactor] = field(init=False)

    def __post_init__(self) -> None:
        self.compactors = {}
        self.refresh_compactors()

    def refresh_compactors(self) -> None:
        """A compactor per agent of the settings in force (at start; after a reload: new agents,
        the summarizer of a changed model), replaced in place."""
        fresh = {agent_id: self._compactor(agent_id) for agent_id in self.settings.agents}
        self.compactors.clear()
        self.compactors.update(fresh)

    def _compactor(self, agent_id: str) -> Compactor:
        agent = self.settings.agents[agent_id]
        summarizer = ModelSummarizer(
            self.providers.get(agent_id),
            model=self.settings.compaction.model or agent.model.name,
            context_window=agent.model.context_window,
            max_output_tokens=agent.model.max_output_tokens,
        )
        return Compactor(self.store, summarizer, self.settings.compaction)

    def threshold(self, agent_id: str | None) -> int:
        return compaction_threshold(self.settings.compaction, self.agent(agent_id).model)

    def agent(self, agent_id: str | None) -> AgentSettings:
        return self.settings.agents[agent_id or "main"]

    def provider(self, agent_id: str | None) -> ModelChain | None:
        return self.providers.get(agent_id or "main")

    def model_name(self, key: str, agent_id: str | None) -> str:
        entry = self.store.entry(key)
        override = entry.settings.get("model") if entry else None
        return str(override or self.agent(agent_id).model.name)

    def queue_mode(self, key: str, agent_id: str | None) -> QueueMode:
        """The session's ``queue_mode`` setting, else the agent's, else ``session.queue.mode``."""
        entry = self.store.entry(key)
        override = entry.settings.get("queue_mode") if entry else None
        mode = override or self.agent(agent_id).queue_mode or self.settings.session.queue.mode
        return mode if mode in QUEUE_MODES else "collect"

    def needs_turn(self, post: Post) -> bool:
        role = post.message.role
        answers = role == "user" or (role == "tool" and post.options is not None and post.options.answer_tool)
        return answers and post.reply and self.provider(post.key.agent_id) is not None

    def turn_lock(self, key: str) -> asyncio.Lock:
        """The key's turn lock: the store's when other processes share it (``TurnLocks``), so
        turns on a key run one at a time across every process; else one of this process."""
        lock = self.turn_locks.get(key)
        if lock is None:
            shared = self.store.turn_lock(key) if isinstance(self.store, TurnLocks) else None
            lock = self.turn_locks[key] = shared or asyncio.Lock()
        return lock

    @contextlib.asynccontextmanager
    async def exclusive(self, key: str) -> AsyncIterator[None]:
        """Both locks: no turn runs and nothing is appended while a lifecycle change happens."""
        async with self.turn_lock(key), self.store.lock_for(key):
            yield

    def context_overhead(self, agent_id: str | None) -> int:
        """Tokens of the system prompt and of the tool schemas the model is sent (none in
        store-only mode), counted toward the threshold."""
        agent = self.agent(agent_id)
        tools = self.tools.schema_tokens() if self.provider(agent_id) else 0
        return estimate_text(agent.system_prompt) + tools

    async def account(
        self, run: RunState, completion: Completion, overhead: int, sent_tokens: int | None = None
    ) -> None:
        """Record usage; with ``sent_tokens`` (the context count when the prompt was read), also
        calibrate the context count, keeping what was appended while the model answered."""
        usage = completion.usage.as_dict()
        await self.store.add_usage(run, usage)
        for kind, value in usage.items():
            if value:
                self.metrics.tokens.labels(kind).inc(value)
        if completion.usage.input_tokens and sent_tokens is not None:
            appended = run.context_tokens - sent_tokens
            self.store.calibrate_context(run, completion.usage.input_tokens, overhead, appended_since=appended)

    async def command_exchange(
        self, run: RunState, asked: str, answer: str, *, client_message_id: str | None = None
    ) -> tuple[MessageRecord, MessageRecord]:
        """Store a chat command and its answer (the answer's ``reply_to`` is the command's seq),
        both queued in one loop pass: one group commit makes them durable together, so a crash
        leaves a command without its answer only between two writes of the writer thread, and
        a redelivery of the command finds the answer it must repeat."""
        question = NewMessage(
            role="user",
            content=asked,
            command=True,
            user_activity=False,
            client_message_id=client_message_id,
        )
        asked_record, asked_durable = self.store.queue_append(run, question)
        reply = NewMessage(
            role="assistant", content=answer, command=True, user_activity=False, reply_to=asked_record["seq"]
        )
        answer_record, answer_durable = self.store.queue_append(run, reply)
        settled = await asyncio.gather(
            self.store.finish_append(run, question, asked_record, asked_durable),
            self.store.finish_append(run, reply, answer_record, answer_durable),
            return_exceptions=True,
        )
        for outcome in settled:
            if isinstance(outcome, BaseException):
                raise outcome
        return asked_record, answer_record

    def ensure_active(self, key: str) -> RunState:
        run = self.store.active_run(key)
        if run is None:
            raise NoActiveRun(f"session {key!r} has no active run")
        return run
