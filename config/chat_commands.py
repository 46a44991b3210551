"""The chat commands, named once: each command's name, how it is written and what it does. The
engine's help (``conversations/commands.py``) and the platforms' command menus (Telegram's
``setMyCommands``, the Slack app's slash commands) are read from here, so a menu never lacks a
command the help lists. ``settings``: the command changes the session's settings, so on a chat
channel it is for the owner and the admins (the default of ``commands.restricted``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatCommand:
    name: str
    usage: str
    summary: str
    settings: bool = False

    @property
    def help_line(self) -> str:
        return f"{self.usage} - {self.summary}"


CHAT_COMMANDS: tuple[ChatCommand, ...] = (
    ChatCommand("new", "/new [text]", "end this session and start a fresh one without the previous summary"),
    ChatCommand("reset", "/reset [text]", "end this session; the next one starts with its summary"),
    ChatCommand("compact", "/compact [instructions]", "summarize older messages now"),
    ChatCommand("uncompact", "/uncompact", "undo the last compaction", settings=True),
    ChatCommand("status", "/status", "run, tokens against the threshold, compactions, next reset"),
    ChatCommand("model", "/model [name|default]", "show or set this session's model", settings=True),
    ChatCommand("pause", "/pause", "pause the session (messages are refused until /resume)", settings=True),
    ChatCommand("resume", "/resume", "resume a paused session", settings=True),
    ChatCommand("stop", "/stop", "cancel the running model turn", settings=True),
    ChatCommand("help", "/help", "this list"),
)
COMMAND_NAMES: tuple[str, ...] = tuple(c.name for c in CHAT_COMMANDS)
SETTINGS_COMMANDS: tuple[str, ...] = tuple(c.name for c in CHAT_COMMANDS if c.settings)
# Telegram's "Start" button sends /start: it gets the help, as /help does (not listed in menus).
ALIASES: dict[str, str] = {"start": "help"}
