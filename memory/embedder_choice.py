"""Which embedder ``memory.embedding`` describes: one of ``memory/embedders.py``'s or the routed
pair of ``memory/routed.py`` (which builds on those, so the choice lives above both)."""

from __future__ import annotations

from collections.abc import Mapping

from config.errors import ConfigError
from config.settings import EmbeddingSettings
from memory.embedders import Embedder, OpenAIEmbedder, SentenceTransformerEmbedder, UniversalSentenceEncoderEmbedder
from memory.routed import RoutedEmbedder


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def build_embedder(settings: EmbeddingSettings, env: Mapping[str, str] | None = None) -> Embedder:
    """The embedder ``memory.embedding`` describes (not started).

    ``env`` is the environment the caller was started with (the daemon's and the CLI's): the API
    key is ``env[settings.api_key_env]`` and ``HF_HUB_OFFLINE`` (1/true/yes/on) keeps a named
    sentence-transformers model off the hub. Nothing is read from ``os.environ``: without ``env``
    there is no key and no offline flag."""
    env = env or {}
    if settings.provider == "openai":
        if not settings.model:
            raise ConfigError("memory.embedding.model is required when memory.embedding.provider is openai")
        return OpenAIEmbedder(
            model=settings.model,
            base_url=settings.base_url,
            api_key=env.get(settings.api_key_env) or None,
            dimensions=settings.dimensions,
            batch_size=settings.batch_size,
        )
    if settings.provider == "auto":
        if settings.model:
            raise ConfigError(
                "memory.embedding.model must be null when memory.embedding.provider is auto "
                "(it uses the two packaged models); set provider: sentence-transformers to use another model"
            )
        return RoutedEmbedder(batch_size=settings.batch_size)
    if settings.provider == "universal-sentence-encoder":
        if settings.model:
            raise ConfigError(
                "memory.embedding.model must be null when memory.embedding.provider is universal-sentence-encoder "
                "(the package ships one model)"
            )
        return UniversalSentenceEncoderEmbedder(batch_size=settings.batch_size)
    return SentenceTransformerEmbedder(
        settings.model, batch_size=min(settings.batch_size, 32), offline=_truthy(env.get("HF_HUB_OFFLINE"))
    )
