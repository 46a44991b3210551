"""The chat commands, named once: each command's name, how it is written and what it does, and
the grammar of a command line (``parse_command``: the engine, the connectors and the routes read
a message as a command alike). The engine's help (``conversations/commands.py``) and the
platforms' command menus (Telegram's ``setMyCommands``, the Slack app's slash commands) are read
from here, so a menu never lacks a command the help lists. ``settings``: the command changes the
session's settings, so on a chat channel it is for the owner and the admins (the default of
``commands.restricted``)."""

from __future__ import annotations

import re
import unicodedata
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

_NAME = re.compile(r"^/([^\W\d_][\w-]*)$")


def parse_command(text: str) -> tuple[str, str] | None:
    """``("compact", "focus on decisions")`` for ``/compact focus on decisions``; None when the
    text is not a command (``/path/to/file`` is not). The command word is NFKC-normalised, so a
    full-width slash and letters typed with an IME (U+FF0F, U+FF53...) make ``/status``; a name in
    any script is a command (an unknown one is answered with the help)."""
    first = text.lstrip()[:1]
    if first.isascii() and first != "/":  # NFKC leaves a leading ASCII character first: no command
        return None
    return parse_command_fully(text)


def parse_command_fully(text: str) -> tuple[str, str] | None:
    """``parse_command`` without its shortcut for a leading ASCII character (what the shortcut is
    tested against)."""
    parts = text.strip().split(maxsplit=1)
    if not parts:
        return None
    match = _NAME.match(unicodedata.normalize("NFKC", parts[0]))
    if match is None:
        return None
    return match.group(1).casefold(), (parts[1] if len(parts) > 1 else "").strip()
