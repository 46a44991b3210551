"""Chat commands (SPEC section 8): typed as a message starting with ``/`` or posted to
``/v1/sessions/{key}/commands``. Command lines and their answers are stored with ``command: true``
and never reach the model; every command answers 200, an unknown one with help."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from config.chat_commands import ALIASES, CHAT_COMMANDS, parse_command
from conversations.hooks import CommandHooks, NextReset
from conversations.run_end import RunEnd, end_active_run
from conversations.turns import Conversations, DeltaFn, Outcome, Post, outcome_from
from sessions.compactor import SummaryResult
from sessions.records import EntryChange, RunState
from sessions.thresholds import compaction_threshold

HELP = {c.name: c.help_line for c in CHAT_COMMANDS}
CONTINUING = ("new", "reset")  # the text after these is posted as the next message (maybe a command)

MAX_MODEL_NAME = 200  # as PATCH /v1/sessions/{key} allows: a sessions.json entry stays small


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a session's model override (``/model`` and ``PATCH settings.model``),
    or None: empty, longer than ``MAX_MODEL_NAME``, or holding a control character (a NUL or a line
    break would go into the provider's request and the console's table as it is)."""
    if not name.strip():
        return "A model name cannot be empty."
    if len(name) > MAX_MODEL_NAME:
        return f"A model name is at most {MAX_MODEL_NAME} characters."
    if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in name):  # U+2028, U+2029: line breaks too
        return "A model name cannot hold control characters (NUL, tab, line breaks)."
    return None
Handler = Callable[["CommandCall"], Awaitable[Outcome]]


def commands_in(text: str) -> list[tuple[str, str]]:
    """Every command ``text`` runs, in order: its own, then, for ``/new`` and ``/reset``, the
    command their text is when it is one (``/new /pause`` pauses the new session). Empty when
    ``text`` is not a command."""
    found: list[tuple[str, str]] = []
    parsed = parse_command(text)
    while parsed is not None:
        found.append(parsed)
        name, args = parsed
        parsed = parse_command(args) if ALIASES.get(name, name) in CONTINUING and args else None
    return found


@dataclass(frozen=True)
class CommandCall:
    post: Post
    name: str
    args: str

    @property
    def key(self) -> str:
        return self.post.key.raw


class Commands:
    def __init__(self, conversations: Conversations, *, hooks: CommandHooks | None = None) -> None:
        self.conv = conversations
        self.store = conversations.store
        self.next_reset: NextReset | None = (hooks or CommandHooks()).next_reset
        self.handlers: dict[str, Handler] = {
            "help": self._help,
            "status": self._status,
            "model": self._model,
            "pause": self._pause,
            "resume": self._resume,
            "stop": self._stop,
            "new": self._new,
            "reset": self._reset,
            "compact": self._compact,
            "uncompact": self._uncompact,
        }
        for alias, name in ALIASES.items():
            self.handlers[alias] = self.handlers[name]

    async def run(self, post: Post, name: str, args: str) -> Outcome:
        handler = self.handlers.get(name, self._unknown)
        return await handler(CommandCall(post, name, args))

    async def run_once(self, post: Post, name: str, args: str) -> Outcome:
        """A command sent with a client_message_id runs at most once: a redelivery answers what the
        first delivery answered (from its idempotency record, or from the transcript, where the
        command line carries the id and its answer the command's seq) and runs nothing again."""
        assert post.message.client_message_id is not None
        previous = await self.conv.find_previous(post.key.raw, post.message.client_message_id)
        if previous is not None:
            if previous["response"] is not None:
                return outcome_from(json.loads(previous["response"]))
            return Outcome(post.key.raw, previous["run_id"], previous["message_seq"], reply=previous.get("reply"))
        outcome = await self.run(post, name, args)
        await self.conv.remember(post.key.raw, post.message.client_message_id, outcome)
        return outcome

    # -- storing a command and its answer -------------------------------------------------------

    async def answer(self, call: CommandCall, text: str, *, run: RunState | None = None) -> Outcome:
        """Store the command line and its answer in the key's active run (if it has one)."""
        async with self.store.lock_for(call.key):
            return await self.answer_locked(call, text, run=run)

    async def answer_locked(self, call: CommandCall, text: str, *, run: RunState | None = None) -> Outcome:
        run = run or self.store.active_run(call.key)
        if run is None:
            return Outcome(call.key, None, None, reply={"content": text, "seq": None})
        asked, answered = await self.conv.command_exchange(
            run, call.post.message.content, text, client_message_id=call.post.message.client_message_id
        )
        return Outcome(call.key, run.run_id, asked["seq"], reply={"content": text, "seq": answered["seq"]})

    # -- the commands ---------------------------------------------------------------------------

    async def _help(self, call: CommandCall) -> Outcome:
        return await self.answer(call, "Commands:\n" + "\n".join(HELP.values()))

    async def _unknown(self, call: CommandCall) -> Outcome:
        text = f"Unknown command /{call.name}. " + "Commands:\n" + "\n".join(HELP.values())
        return await self.answer(call, text)

    async def _compact(self, call: CommandCall) -> Outcome:
        async with self.conv.turn_lock(call.key):
            run = self.store.active_run(call.key)
            if run is None:
                return await self.answer(call, "Nothing to compact: this session has no active run.")
            summaries: list[SummaryResult] = []
            result = await self.conv.compact(
                run, None, trigger="manual", instructions=call.args or None, on_summary=summaries.append
            )
            failed = next((s for s in summaries if s.error), None)
            model_note = (
                f" The model failed to summarize ({failed.model}: {failed.error}), so the extractive summary was used."
                if failed is not None
                else ""
            )
            if result is None and not summaries:
                minimum = self.conv.settings.compaction.min_to_compress
                keep = self.conv.settings.compaction.keep_recent
                text = f"Nothing to compact yet: fewer than {minimum} messages come before the {keep} most recent ones."
                return await self.answer(call, text)
            if result is None:
                text = f"Nothing was compacted: the summary would not be shorter than the messages.{model_note}"
                return await self.answer(call, text)
            text = (
                f"Compacted messages {result.start_seq}-{result.end_seq} into a summary"
                f" ({result.tokens_before} -> {result.tokens_after} tokens, {result.summarizer})."
                f"{model_note} Send /uncompact to undo."
            )
            outcome = await self.answer(call, text)
            outcome.events.append(result.event())
            return outcome

    async def _uncompact(self, call: CommandCall) -> Outcome:
        async with self.conv.turn_lock(call.key):
            run = self.store.active_run(call.key)
            reverted = None
            if run is not None:
                reverted = await self.conv.compactors[run.agent_id or "main"].uncompact(run)
            if reverted is None:
                return await self.answer(call, "Nothing to undo: no compaction to revert in this session.")
            outcome = await self.answer(
                call,
                f"Restored the context from before compaction {reverted}."
                " Automatic compaction waits until the next model call.",
            )
            outcome.events.append({"type": "uncompact", "reverts": reverted})
            return outcome

    async def _status(self, call: CommandCall) -> Outcome:
        return await self.answer(call, self.status_text(call.key, call.post.key.agent_id))

    def status_text(self, key: str, agent_id: str | None) -> str:
        entry = self.store.entry(key)
        run = self.store.active_run(key)
        agent = self.conv.agent(agent_id)
        threshold = compaction_threshold(self.conv.settings.compaction, agent.model)
        used = (run.context_tokens if run else 0) + self.conv.context_overhead(agent_id)
        nxt = self.next_reset(key) if self.next_reset and entry else None
        provider = self.conv.provider(agent_id)
        lines = [
            f"Session: {key}",
            f"Run: {run.run_id} ({run.status})" if run else "Run: none (the next message starts one)",
            f"Tokens: {used} / {threshold} ({100 * used // max(threshold, 1)}%)",
            f"Compactions: {run.compaction_count if run else 0}",
            f"Next reset: {nxt.isoformat() if nxt else 'none scheduled'}",
            f"Model: {self.conv.model_name(key, agent_id)}" if provider else "Model: none (store-only mode)",
        ]
        if entry is not None:
            usage = (entry.input_tokens, entry.output_tokens, entry.cache_read_tokens, entry.cache_write_tokens)
            lines.append("Usage: input {} / output {} / cache read {} / cache write {}".format(*usage))
        return "\n".join(lines)

    async def _model(self, call: CommandCall) -> Outcome:
        entry = self.store.entry(call.key)
        agent_id = call.post.key.agent_id
        if self.conv.provider(agent_id) is None and not call.args:
            text = (
                "No model is configured (store-only mode): messages are stored without replies. Set"
                f" agents.{agent_id or 'main'}.model.base_url to answer through a model."
            )
            return await self.answer(call, text)
        if not call.args:
            return await self.answer(call, f"Model: {self.conv.model_name(call.key, agent_id)}")
        if entry is None:
            return await self.answer(call, "No session yet: send a message first, then set its model.")
        if call.args.lower() in ("default", "reset"):
            await self.store.update_entry(call.key, EntryChange(settings={"model": None}))
            return await self.answer(call, f"Model reset to the default: {self.conv.agent(agent_id).model.name}")
        problem = model_name_problem(call.args)
        if problem is not None:
            return await self.answer(call, problem)
        await self.store.update_entry(call.key, EntryChange(settings={"model": call.args}))
        return await self.answer(call, f"Model set to {call.args} for this session.")

    async def _pause(self, call: CommandCall) -> Outcome:
        async with self.conv.exclusive(call.key):
            refusal = self._refusal(call.key, "pause", "paused", "Already paused. Send /resume to continue.")
            if refusal is not None:
                return await self.answer_locked(call, refusal)
            outcome = await self.answer_locked(call, "Paused. Messages are refused until /resume.")
            await self.store.pause(call.key)
            return outcome

    async def _resume(self, call: CommandCall) -> Outcome:
        async with self.conv.exclusive(call.key):
            refusal = self._refusal(call.key, "resume", "running", "Not paused.")
            if refusal is not None:
                return await self.answer_locked(call, refusal)
            await self.store.resume(call.key)
            return await self.answer_locked(call, "Resumed.")

    def _refusal(self, key: str, verb: str, status: str, already: str) -> str | None:
        """Why ``verb`` cannot be done to the key's run (none, or it is ``status`` already)."""
        run = self.store.active_run(key)
        if run is None:
            return f"Nothing to {verb}: this session has no active run."
        return already if run.status == status else None

    async def _stop(self, call: CommandCall) -> Outcome:
        stopped = self.conv.stop_turn(call.key)
        return await self.answer(call, "Stopped the running turn." if stopped else "No turn is running.")

    async def _new(self, call: CommandCall) -> Outcome:
        return await self._end_and_maybe_continue(call, inherit=False)

    async def _reset(self, call: CommandCall) -> Outcome:
        return await self._end_and_maybe_continue(call, inherit=True)

    async def _end_and_maybe_continue(self, call: CommandCall, *, inherit: bool) -> Outcome:
        """``/new`` and ``/reset``: their lines belong to the run they end; the new run opens with
        the next message, or with the text after the command."""
        word = "new session" if not inherit else "reset"
        async with self.conv.exclusive(call.key):
            run = self.store.active_run(call.key)
            if run is None:
                text = "Started fresh." if not inherit else "Reset: the next message starts a new session."
                outcome = await self.answer_locked(call, text)
            else:
                text = (
                    "Started a new session without the previous summary."
                    if not inherit
                    else "Session reset. The next session starts with a summary of this one."
                )
                outcome = await self.answer_locked(call, text, run=run)
                how = RunEnd("command", store_reason="reset" if inherit else "new", flush=inherit,
                             command=f"/{call.name}", counted=word)  # fmt: skip
                _, event = await end_active_run(self.conv, call.key, how)
                outcome.events.append(event)
            await self.store.set_inherit_next(call.key, inherit)
        if not call.args:
            return outcome
        rest = replace(call.post.message, content=call.args, client_message_id=None)
        follow = await dispatch(self, replace(call.post, message=rest))
        follow.events = outcome.events + follow.events
        return follow


async def dispatch(commands: Commands, post: Post, *, on_delta: DeltaFn | None = None) -> Outcome:
    """The one entry point for posted messages: a user message that is a command runs it."""
    if post.message.role == "user":
        parsed = parse_command(post.message.content)
        if parsed is not None:
            if post.message.client_message_id is None:
                return await commands.run(post, *parsed)
            return await commands.conv.once(post, lambda: commands.run_once(post, *parsed))
    return await commands.conv.post(post, on_delta=on_delta)
