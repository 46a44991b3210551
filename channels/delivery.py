"""``deliver_to``: POST a turn's answer as JSON to a URL (webhooks now, cron jobs later).

One ``aiohttp.ClientSession`` per process, opened and closed by the composition root
(``gateway/services.py``), for the daemon and the offline CLI alike. Delivery runs off the request
path (in the background task that ran the turn); failures are retried a couple of times and
then logged, never raised into a request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from conversations.hooks import Delivery

__all__ = ["Deliverer", "Delivery"]  # Delivery, the report, is the engine's (conversations/hooks.py)

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 425, 429})


class Deliverer:
    def __init__(self, session: aiohttp.ClientSession, *, retries: int = 2, backoff_s: float = 0.5) -> None:
        self.session = session
        self.retries = retries
        self.backoff_s = backoff_s

    async def deliver(self, url: str, payload: Mapping[str, Any], *, timeout: float) -> bool:
        """POST ``payload`` to ``url``; True once a 2xx answers (``report`` says why not)."""
        return (await self.report(url, payload, timeout=timeout)).delivered

    async def report(self, url: str, payload: Mapping[str, Any], *, timeout: float) -> Delivery:
        """POST ``payload`` to ``url``. A connection error, a timeout, a 5xx, 408, 425 or 429 is
        retried ``retries`` times with growing pauses; anything else, or the last failure, is
        logged and reported with its reason."""
        attempts = self.retries + 1
        for attempt in range(1, attempts + 1):
            problem = await self._attempt(url, payload, timeout)
            if problem is None:
                log.info("delivered %s to %s", _what(payload), url)
                return Delivery(url, True, attempt)
            retriable, reason = problem
            if not retriable or attempt == attempts:
                log.error("could not deliver %s to %s after %d attempt(s): %s", _what(payload), url, attempt, reason)
                return Delivery(url, False, attempt, reason)
            log.warning("delivering %s to %s failed (%s); retry %d of %d", _what(payload), url, reason, attempt,
                        self.retries)  # fmt: skip
            await asyncio.sleep(self.backoff_s * attempt)
        raise AssertionError("unreachable: the last attempt returns")

    async def _attempt(self, url: str, payload: Mapping[str, Any], timeout: float) -> tuple[bool, str] | None:
        try:
            async with self.session.post(url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if 200 <= resp.status < 300:
                    return None
                retriable = resp.status >= 500 or resp.status in RETRY_STATUSES
                return retriable, f"HTTP {resp.status} {resp.reason or ''}".strip()
        except TimeoutError:
            return True, f"no answer within {timeout} s"
        except aiohttp.InvalidURL as exc:
            return False, f"invalid URL: {exc}"
        except aiohttp.ClientError as exc:
            return True, f"{type(exc).__name__}: {exc}"


def _what(payload: Mapping[str, Any]) -> str:
    return f"the reply for {payload.get('session_key')!r} (seq {payload.get('message_seq')})"
