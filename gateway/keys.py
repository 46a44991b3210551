"""Typed application state keys (aiohttp ``web.AppKey``)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from config.clock import Clock
from config.loader import LoadedConfig
from gateway.commands import Commands
from gateway.events import EventHub
from gateway.metrics import Metrics
from gateway.turns import Conversations
from sessions.store import SessionStore

CONFIG = web.AppKey("config", LoadedConfig)
CLOCK: web.AppKey[Clock] = web.AppKey("clock")
ENV = web.AppKey("env", dict[str, str])
STORE = web.AppKey("store", SessionStore)
HUB = web.AppKey("hub", EventHub)
METRICS = web.AppKey("metrics", Metrics)
CONVERSATIONS = web.AppKey("conversations", Conversations)
COMMANDS = web.AppKey("commands", Commands)
READY = web.AppKey("ready", dict[str, bool])
EXTRAS = web.AppKey("extras", dict[str, Any])
