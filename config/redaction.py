"""Secrets kept out of every text the gateway writes or serves (SPEC section 14: tokens never
appear in logs, API answers or pages). A client library puts its token where it likes: aiogram
calls ``<api_base>/bot<token>/getMe`` and its errors quote that URL. So the gateway registers every
secret value it reads from the environment (chat tokens and signing secrets, model API keys, its
own bearer tokens) in :data:`SECRETS`, and the log handler, ``GET /v1/channels`` and ``channels
status`` pass their text through it. A Bot API token in a URL is hidden even when it was never
registered (a token changed since, a library's own retry)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

REDACTED = "***"
MIN_LENGTH = 6  # a shorter value would hide ordinary words; no real token is that short
_BOT_PATH = re.compile(r"/bot\d{3,}:[A-Za-z0-9_-]{20,}")  # /bot<id>:<secret> of the Telegram Bot API


class Redactor:
    """The secret values to hide, added as they are read; callable on a text."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._lock = threading.Lock()

    def add(self, values: Iterable[str | None]) -> None:
        with self._lock:
            fresh = {v for v in values if v and len(v) >= MIN_LENGTH} - self._values
            if not fresh:
                return
            self._values |= fresh
            longest_first = sorted(self._values, key=len, reverse=True)  # a token that holds another
            self._pattern = re.compile("|".join(re.escape(v) for v in longest_first))

    def __call__(self, text: str) -> str:
        pattern = self._pattern
        if pattern is not None:
            text = pattern.sub(REDACTED, text)
        return _BOT_PATH.sub(f"/bot{REDACTED}", text)


SECRETS = Redactor()
