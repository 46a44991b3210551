"""Typed application state keys (aiohttp ``web.AppKey``).

``SERVICES`` is the object graph the composition root built (``gateway/services.py``); the other
keys name parts of it for the routes, set together by the one services cleanup context in
``gateway/app.py``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from channels.hooks import Webhooks
from channels.intake import ChannelIntake
from config.clock import Clock
from config.loader import LoadedConfig
from conversations.commands import Commands
from conversations.events import EventHub
from conversations.housekeeping import Scheduling
from conversations.metrics import Metrics
from conversations.turns import Conversations
from gateway.handoff import Handoff
from gateway.openai_compat.service import OpenAICompat
from gateway.services import Services
from memory import MemoryService
from scheduler.service import SchedulerService
from sessions.history_index import HistoryIndexProtocol
from sessions.keys import SessionKey
from sessions.protocol import StoreProtocol

CONFIG = web.AppKey("config", LoadedConfig)
CLOCK: web.AppKey[Clock] = web.AppKey("clock")
ENV = web.AppKey("env", dict[str, str])
SERVICES = web.AppKey("services", Services)
STORE: web.AppKey[StoreProtocol] = web.AppKey("store")
HUB = web.AppKey("hub", EventHub)
METRICS = web.AppKey("metrics", Metrics)
CONVERSATIONS = web.AppKey("conversations", Conversations)
COMMANDS = web.AppKey("commands", Commands)
READY = web.AppKey("ready", dict[str, bool])
MEMORY = web.AppKey("memory", MemoryService)
HISTORY = web.AppKey("history", HistoryIndexProtocol)
SCHEDULING = web.AppKey("scheduling", Scheduling)
SCHEDULER = web.AppKey("scheduler", SchedulerService)
WEBHOOKS = web.AppKey("webhooks", Webhooks)
COMPAT = web.AppKey("openai_compat", OpenAICompat)
CHANNELS = web.AppKey("channels", ChannelIntake)
REINDEX = web.AppKey("reindex", dict[str, Any])  # the running reindex's progress (GET /v1/memory/status)
HANDOFF = web.AppKey("handoff", Handoff)  # workers: a key's posts go to the worker that owns it
PARSED_KEYS = web.AppKey("parsed_keys", dict[str, SessionKey])  # a cache of the sessions routes
