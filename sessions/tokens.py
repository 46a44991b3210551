"""Token estimates (seed 000): ``len // 4``, or ``len // 2`` for mostly-Japanese text."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _is_cjk(code: int) -> bool:
    return (
        0x3040 <= code <= 0x309F  # hiragana
        or 0x30A0 <= code <= 0x30FF  # katakana
        or 0x31F0 <= code <= 0x31FF  # katakana phonetic extensions
        or 0xFF66 <= code <= 0xFF9F  # half-width katakana
        or 0x3400 <= code <= 0x4DBF  # CJK extension A
        or 0x4E00 <= code <= 0x9FFF  # CJK unified ideographs
    )


def estimate_text(text: str) -> int:
    """Estimated tokens of a text; at least 1 when the text is not empty."""
    if not text:
        return 0
    length = len(text)
    if length < 4096 and text.isascii():
        return max(1, length // 4)
    cjk = sum(1 for ch in text if _is_cjk(ord(ch)))
    divisor = 2 if cjk * 2 >= length else 4
    return max(1, length // divisor)


def estimate_message(message: Mapping[str, Any]) -> int:
    """Content plus tool-call arguments (as their JSON text)."""
    content = message.get("content")
    total = estimate_text(content) if isinstance(content, str) else 0
    for call in message.get("tool_calls") or ():
        function = call.get("function", call) if isinstance(call, Mapping) else {}
        arguments = function.get("arguments", "")
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        total += estimate_text(text) + estimate_text(str(function.get("name", "")))
    return total
