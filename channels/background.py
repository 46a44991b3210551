"""Stored now, the turn in the background, the answer delivered: the one path webhooks
(``channels/hooks.py``) and chat connectors (``channels/intake.py``) take into the engine.

``BackgroundTurns.launch(name, turn)`` runs ``turn(stored)`` in a task it tracks and returns a
future that resolves once the turn calls ``stored(outcome)``, i.e. once its message is durable: the
caller answers its sender then (a webhook's 202, a Socket Mode acknowledgement, a Telegram offset)
while the model turn and the delivery of its answer go on. An error the turn raises before that is
the future's error (nothing was stored: the caller answers it); a turn that ends without either
(shutdown cancelled it) fails the future with ``ShuttingDown``.

``post_and_deliver`` is the common turn: post through ``Conversations``, then hand what came of it
(the answer, or a :class:`TurnFailure` after the message was stored) to a deliver function.

No HTTP here: callers render the typed values they get back. This is the one module of
``channels/`` that imports the engine (``conversations.turns`` today).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from config.errors import NeotaskError, ShuttingDown
from conversations.turns import Conversations, Outcome, Post

log = logging.getLogger(__name__)
T = TypeVar("T")
StoredFn = Callable[[Outcome], None]
Turn = Callable[[StoredFn], Awaitable[T]]

__all__ = ["BackgroundTurns", "Conversations", "Deliver", "Outcome", "Post", "StoredFn", "TurnFailure"]


@dataclass(frozen=True)
class TurnFailure:
    """Why a turn gave no answer after its message was stored (what a delivery reports)."""

    code: str
    message: str

    def as_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


Deliver = Callable[[Outcome, TurnFailure | None], Awaitable[None]]


class BackgroundTurns:
    """The background turns in progress; shutdown cancels them."""

    def __init__(self, conversations: Conversations) -> None:
        self.conv = conversations
        self._tasks: set[asyncio.Task[Any]] = set()

    def launch(
        self, name: str, turn: Turn[T], *, on_done: Callable[[asyncio.Task[T]], None] | None = None
    ) -> asyncio.Future[Outcome]:
        """Run ``turn`` in a task; the future resolves when it calls ``stored`` (see the module)."""
        stored: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()

        def on_stored(outcome: Outcome) -> None:
            if not stored.done():
                stored.set_result(outcome)

        async def run() -> T:
            try:
                return await turn(on_stored)
            except BaseException as exc:
                if not stored.done():  # nothing stored: the caller answers the error
                    stored.set_exception(exc if isinstance(exc, Exception) else ShuttingDown(
                        "the gateway stopped before the message was stored"))  # fmt: skip
                    stored.exception()  # retrieved: a caller that stopped waiting logs nothing
                raise

        task = asyncio.create_task(run(), name=name)
        self._tasks.add(task)

        def done(finished: asyncio.Task[T]) -> None:
            self._tasks.discard(finished)
            if not stored.done():
                stored.set_exception(ShuttingDown("the gateway stopped before the message was stored"))
                stored.exception()
            if on_done is not None:
                on_done(finished)
            elif not finished.cancelled() and not isinstance(exc := finished.exception(), NeotaskError | None):
                log.error("background turn %s failed", finished.get_name(), exc_info=exc)

        task.add_done_callback(done)
        return stored

    async def post_and_deliver(self, post: Post, deliver: Deliver | None, *, name: str) -> Outcome:
        """Store ``post`` and return its outcome once durable; the turn goes on, and ``deliver``
        (when given) gets its answer, or the failure that stopped it (not a shutdown: the turn was
        stopped, not failed, and nothing is delivered)."""

        async def turn(stored: StoredFn) -> None:
            try:
                outcome = await self.conv.post(post, on_stored=stored)
            except Exception as exc:
                if not stored_outcome.done():  # nothing stored: the error is the caller's answer
                    raise
                kept = stored_outcome.result()
                if isinstance(exc, ShuttingDown):  # the turn was stopped, not failed
                    log.info("%s: shutdown stopped the turn on %s (seq %s stored)", name, post.key.raw,
                             kept.message_seq)  # fmt: skip
                    return
                if isinstance(exc, NeotaskError):
                    log.warning("%s: the turn on %s failed after seq %s was stored: %s", name, post.key.raw,
                                kept.message_seq, exc.message)  # fmt: skip
                    failure = TurnFailure(exc.code, exc.message)
                else:
                    log.exception("%s: the turn on %s failed", name, post.key.raw)
                    failure = TurnFailure(NeotaskError.code, "the gateway failed on this turn; see its log")
                if deliver is not None:
                    await deliver(kept, failure)
                return
            stored(outcome)  # a repeat of a stored message stores nothing and calls no on_stored
            if deliver is not None:
                await deliver(outcome, None)

        stored_outcome = self.launch(name, turn)
        return await asyncio.shield(stored_outcome)

    async def idle(self) -> None:
        """Wait until every background turn (and its delivery) has finished."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def close(self) -> None:
        """Cancel the background turns and wait for them (shutdown)."""
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            log.info("cancelling %d background turn(s) for shutdown", len(tasks))
            await asyncio.gather(*tasks, return_exceptions=True)
