"""Daily token budgets: ``agents.<id>.limits.tokens_per_day`` (every key of the
agent) and ``tokens_per_key_per_day`` (each session key), counted in input plus output tokens per
UTC day from tasks.db's ``usage_daily`` (``sessions/usage.py``).

The check is a ``ConversationHooks.before_post`` hook: a message that would need a model turn is
refused with 429 ``token_budget_exhausted`` before anything is stored, so the caller can send it
again the next day. Chat commands never reach it (``/status`` still answers). A turn that began
under the budget ends normally even when its tokens cross it; the next message is refused."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, time, timedelta

from config.clock import Clock
from config.errors import TokenBudgetExhausted
from config.settings import Settings
from sessions.protocol import UsageRecords
from sessions.usage import usage_day


def seconds_to_next_day(now: datetime) -> float:
    """Seconds from ``now`` to the next 00:00 UTC, when a budget renews (at least 1)."""
    utc = now.astimezone(UTC)
    midnight = datetime.combine(utc.date() + timedelta(days=1), time(), tzinfo=UTC)
    return max(1.0, (midnight - utc).total_seconds())


class Budgets:
    def __init__(self, store: UsageRecords, settings: Callable[[], Settings], clock: Clock) -> None:
        self.store = store
        self.settings = settings  # read at each check: the settings in force (a reload may swap them)
        self.clock = clock

    async def check(self, agent_id: str, key: str) -> None:
        """Raise ``TokenBudgetExhausted`` when the agent's or the key's budget of today is spent."""
        limits = self.settings().agents[agent_id].limits
        if limits.tokens_per_day is None and limits.tokens_per_key_per_day is None:
            return
        now = self.clock()
        day = usage_day(now)
        agent_total, key_total = await self.store.tokens_spent(day, agent_id, key)
        renew = seconds_to_next_day(now)
        hours, minutes = int(renew // 3600), int(renew % 3600 // 60)
        when = f"it renews at 00:00 UTC (in {hours} h {minutes:02d} min)"
        for whose, used, setting, limit in (
            (f"agent {agent_id!r}", agent_total, "tokens_per_day", limits.tokens_per_day),
            (f"session {key!r}", key_total, "tokens_per_key_per_day", limits.tokens_per_key_per_day),
        ):
            if limit is not None and used >= limit:
                raise TokenBudgetExhausted(
                    f"{whose} has used its daily token budget ({used} of agents.{agent_id}.limits.{setting}"
                    f" {limit} on {day}, UTC); the message was not stored: send it again once {when}, or raise"
                    " the limit",
                    retry_after_s=renew,
                    agent=agent_id,
                    used=used,
                    limit=limit,
                )
