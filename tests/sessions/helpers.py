"""Helpers for session-engine tests: settings from defaults plus overrides, and runs to play with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from config.clock import Clock
from config.loader import build_settings, deep_merge, load_defaults
from config.settings import Settings
from sessions.files.store import SessionStore
from sessions.records import RunStart, RunState, TaskKey
from sessions.store_hooks import StoreHooks


def settings_with(overrides: dict[str, Any] | None = None) -> Settings:
    return build_settings(deep_merge(load_defaults(), overrides or {}))


async def open_store(
    home: Path, clock: Clock, overrides: dict[str, Any] | None = None, *, hooks: StoreHooks | None = None
) -> SessionStore:
    return await SessionStore.open(home, settings_with(overrides), clock=clock, hooks=hooks or StoreHooks())


async def start(store: SessionStore, key: str = "agent:main:main", *, user: str | None = "u1") -> RunState:
    return await store.start_run(
        RunStart(
            key,
            agent_id="main",
            chat_type="direct",
            channel=None,
            task_key=TaskKey(task_type="agent", task_identifier=key, user=user),
        ),
    )
