"""When the context is too big: the compaction threshold of SPEC section 5 (pure)."""

from __future__ import annotations

from config.settings import CompactionSettings, ModelSettings


def compaction_threshold(compaction: CompactionSettings, model: ModelSettings) -> int:
    """``token_threshold`` when set, else ``min(ratio * window, window - max_output_tokens)``."""
    if compaction.token_threshold is not None:
        return compaction.token_threshold
    window = model.context_window
    return max(1, min(int(compaction.threshold_ratio * window), window - model.max_output_tokens))
