"""The conversation engine's state and configuration (``ConversationCore``), under the layers
``conversations/idempotency.py`` → ``conversations/compaction_triggers.py`` → ``conversations/model_turn.py`` →
``conversations/turns.py`` (posting and per-key order), each a subclass of the one before."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from config.clock import Clock
from config.errors import NoActiveRun, ShuttingDown
from config.settings import AgentSettings, QueueMode, Settings
from conversations.completions import Completion
from conversations.events import EventHub
from conversations.fallbacks import ModelChain
from conversations.hooks import ConversationHooks
from conversations.metrics import Metrics
from conversations.posts import Post, ReplyBody
from conversations.queueing import QUEUE_MODES, Batch, Caller, TurnQueue
from conversations.summarizer import ModelSummarizer
from conversations.tools import ToolBox
from sessions.compactor import Compactor
from sessions.protocol import ConversationStore, TurnLocks
from sessions.records import MessageRecord, NewMessage, RunState
from sessions.thresholds import compaction_threshold
from sessions.tokens import estimate_text

log = logging.getLogger(__name__)


class ConversationCore:
    """The state of the conversation engine and what every layer reads: the agent's settings,
    provider and model, the per-key turn locks, the context overhead, usage accounting."""

    def __init__(
        self,
        store: ConversationStore,
        settings: Settings,
        *,
        providers: Mapping[str, ModelChain],
        hub: EventHub,
        metrics: Metrics,
        clock: Clock,
        tools: ToolBox | None = None,
        hooks: ConversationHooks | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.providers = providers
        self.hub = hub
        self.metrics = metrics
        self.clock = clock
        self.hooks = hooks or ConversationHooks()
        self.tools = tools if tools is not None else ToolBox(store)
        self._turn_locks: dict[str, asyncio.Lock] = {}
        self._running: dict[str, asyncio.Task[Any]] = {}
        # runs a posted message's automatic compaction is under way for: whether a message was
        # stored meanwhile (and answered without waiting), so the threshold is checked again after it
        self._compacting: dict[str, bool] = {}
        self._rechecks: set[asyncio.Task[None]] = set()  # those checks, made after the compaction
        self.queue = TurnQueue(self._batch_turn, self.turn_lock, self._closing_error)
        self.closing = False
        self._inflight: dict[tuple[str, str], asyncio.Future[ReplyBody]] = {}
        # keys of one-off runs nothing can inherit (a stateless OpenAI-compatible call): no memory
        # flush saves their facts, and they end without a final summary
        self.one_off: set[str] = set()
        self.compactors = {agent_id: self._compactor(agent_id) for agent_id in settings.agents}

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
        lock = self._turn_locks.get(key)
        if lock is None:
            shared = self.store.turn_lock(key) if isinstance(self.store, TurnLocks) else None
            lock = self._turn_locks[key] = shared or asyncio.Lock()
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

    async def _account(
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

    async def _batch_turn(self, batch: Batch) -> None:
        """Run one model turn for ``batch``: the posting layer's (``conversations/turns.py``)."""
        raise NotImplementedError

    def _closing_error(self, caller: Caller) -> BaseException:
        return ShuttingDown(
            f"the gateway is shutting down: the turn was stopped; the message is stored (seq {caller.seq})",
            message_seq=caller.seq,
            stored=True,
        )

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
