"""``neotask init``: a home and its first ``config.yaml``, from answers asked on a terminal or given
as flags (``--non-interactive``).

Every answer is checked as it is given (a bad one is asked again on a terminal, refused with the
reason under ``--non-interactive``), then the whole file as ``neotask config check`` checks it, then
(``--check-model``) the model answers one request; only then is the file written, beside a home
made private (0700). An existing file is kept unless ``--force``. Exit status: 0 written, 1 the
file exists or the model did not answer, 2 a bad answer (nothing written), 4 the configuration as
a whole is refused (nothing written).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from config.loader import LoadedConfig, load_config
from gateway import exits
from gateway.first_config import PARSERS, RESET_MODES, Answers, data, render, tree
from gateway.places import version
from home.permissions import tighten_root

if TYPE_CHECKING:
    from gateway.cli_context import Context

CHECK_MODEL_TIMEOUT_S = 30.0
Asker = Callable[[str], str]


class Refused(Exception):
    """A bad answer under ``--non-interactive``: the flag and the reason."""


FLAGS = (  # the answers as flags: (flag, metavar, help); each value is checked by first_config.PARSERS
    ("--base-url", "URL", "the model server, OpenAI-compatible (default: none, store-only)"),
    ("--model", "NAME", f"the model's name (default {Answers.model})"),
    ("--api-key-env", "VAR", f"the variable holding the API key (default {Answers.api_key_env})"),
    ("--telegram-token-env", "VAR", "the variable holding a Telegram bot token (default: no Telegram)"),
    ("--slack-bot-token-env", "VAR", "the variable holding a Slack bot token (default: no Slack)"),
    (
        "--slack-app-token-env",
        "VAR",
        f"the variable holding the Slack app token (default {Answers.slack_app_token_env})",
    ),
    ("--discord-token-env", "VAR", "the variable holding a Discord bot token (default: no Discord)"),
    ("--matrix-homeserver", "URL", "the Matrix homeserver, https://matrix.example.org (default: no Matrix)"),
    ("--matrix-user-id", "ID", "the Matrix bot user's id, @bot:example.org (needed with --matrix-homeserver)"),
    (
        "--matrix-token-env",
        "VAR",
        f"the variable holding the Matrix access token (default {Answers.matrix_token_env})",
    ),
    ("--reset", "POLICY", f"{' | '.join(RESET_MODES)} (default {Answers.reset})"),
    ("--reset-hour", "HOUR", f"the local hour of the daily reset, 0-23 (default {Answers.reset_hour})"),
    ("--idle-minutes", "MIN", f"minutes idle before an idle reset (default {Answers.idle_minutes:g})"),
)


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    init = commands.add_parser(
        "init",
        parents=[common],
        help="create the home and its config.yaml (asks on a terminal; --non-interactive takes flags)",
        description="Create the home (mode 0700) and <home>/config.yaml. On a terminal it asks each question "
        "(the flags' values are the defaults offered); --non-interactive takes the flags alone.",
    )
    init.add_argument("--non-interactive", action="store_true", help="ask nothing: the answers are the flags")
    init.add_argument("--force", action="store_true", help="replace an existing config file")
    init.add_argument("--check-model", action="store_true", help="make one request to the model before writing")
    answers = init.add_argument_group("answers")
    for flag, metavar, text in FLAGS:
        answers.add_argument(flag, metavar=metavar, help=text)
    init.set_defaults(handler=cmd_init)


# (answer, question, asked when) in the order they are asked
QUESTIONS: tuple[tuple[str, str, Callable[[Answers], bool]], ...] = (
    ("base_url", "The model server's base URL, OpenAI-compatible (e.g. http://127.0.0.1:11434/v1;"
                 " none: store-only)", lambda a: True),
    ("model", "The model's name", lambda a: bool(a.base_url)),
    ("api_key_env", "The environment variable holding its API key", lambda a: bool(a.base_url)),
    ("telegram_token_env", "Telegram: the variable holding the bot token (e.g. TELEGRAM_BOT_TOKEN; none: no Telegram)",
     lambda a: True),
    ("slack_bot_token_env", "Slack: the variable holding the bot token (e.g. SLACK_BOT_TOKEN; none: no Slack)",
     lambda a: True),
    ("slack_app_token_env", "Slack: the variable holding the app-level token", lambda a: bool(a.slack_bot_token_env)),
    ("discord_token_env", "Discord: the variable holding the bot token (e.g. DISCORD_TOKEN; none: no Discord)",
     lambda a: True),
    ("matrix_homeserver", "Matrix: the homeserver (e.g. https://matrix.example.org; none: no Matrix)",
     lambda a: True),
    ("matrix_user_id", "Matrix: the bot user's id (e.g. @bot:example.org)", lambda a: bool(a.matrix_homeserver)),
    ("matrix_token_env", "Matrix: the variable holding its access token", lambda a: bool(a.matrix_homeserver)),
    ("reset", f"Reset policy ({', '.join(RESET_MODES)})", lambda a: True),
    ("reset_hour", "The local hour of the daily reset (0-23)", lambda a: a.reset in ("daily", "both")),
    ("idle_minutes", "Minutes idle before a session is reset", lambda a: a.reset in ("idle", "both")),
)  # fmt: skip


def from_flags(args: argparse.Namespace) -> Answers:
    """The flags given, each checked; ``Refused`` names the first bad one."""
    given: dict[str, Any] = {}
    for name, parse in PARSERS.items():
        raw = getattr(args, name, None)
        if raw is None:
            continue
        try:
            given[name] = parse(raw)
        except ValueError as exc:
            raise Refused(f"--{name.replace('_', '-')}: {exc}") from None
    return replace(Answers(), **given)


def ask(answers: Answers, asker: Asker, out: Callable[[str], None]) -> Answers:
    """Each question in turn, the current answer offered as the default; a bad answer is said why
    and asked again."""
    for name, question, when in QUESTIONS:
        if not when(answers):
            continue
        current = getattr(answers, name)
        shown = "none" if current is None else f"{current:g}" if isinstance(current, float) else str(current)
        while True:
            text = asker(f"{question} [{shown}]: ")
            if not text.strip():
                break
            try:
                answers = replace(answers, **{name: PARSERS[name](text)})
                break
            except ValueError as exc:
                out(f"  not taken: {exc}")
    return answers


def cmd_init(ctx: Context) -> int:
    args = ctx.args
    try:
        answers = from_flags(args)
    except Refused as exc:
        return _refuse(str(exc))
    interactive = not args.non_interactive
    if interactive and not sys.stdin.isatty():
        return _refuse("standard input is not a terminal: give the answers as flags with --non-interactive "
                       "(neotask init --help lists them)")  # fmt: skip
    target = _target(ctx)
    if target.exists() and not args.force:
        print(f"error: {target} exists: it is kept; pass --force to replace it", file=sys.stderr)
        return exits.FAILED
    if interactive:
        ctx.print(f"Neotask {version()}: a new configuration for the home {ctx.home} (Enter keeps [the default])")
        try:
            answers = ask(answers, input, ctx.print)
        except EOFError:
            return _refuse("no answer (end of input): nothing was written")
    if answers.matrix_homeserver and not answers.matrix_user_id:
        return _refuse("--matrix-user-id: a Matrix account needs the bot user's id (e.g. @bot:example.org)")
    if args.check_model and not answers.base_url:
        return _refuse("--check-model needs a model: give its base URL (--base-url)")
    config = load_config(env=ctx.env, home=ctx.home, config_path=target, user_data=data(tree(answers)))
    warnings = _checked(config, ctx.env)  # ConfigError: exit 4 (gateway.cli), nothing written
    if args.check_model:
        failure = check_model(config, ctx.env)
        if failure is not None:
            print(f"error: the model did not answer: {failure}; nothing was written "
                  "(leave out --check-model to write it anyway)", file=sys.stderr)  # fmt: skip
            return exits.FAILED
        ctx.print(f"the model {answers.model} at {answers.base_url} answered")
    text = render(answers, written_by=f"neotask init (neotask {version()})")
    widened = _make_home(ctx.home)
    if not _write(target, text, replace_existing=args.force):
        print(f"error: {target} exists: it is kept; pass --force to replace it", file=sys.stderr)
        return exits.FAILED
    ctx.print(f"wrote {target}")
    if widened is not None:
        ctx.print(f"the home {ctx.home} was mode {widened:04o}: now {widened & 0o700:04o}")
    for warning in warnings:
        if not _about_unset(warning, answers):  # the next steps below name those
            ctx.print(f"warning: {warning}")
    ctx.print(_next_steps(ctx, answers))
    return exits.OK


def _refuse(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return exits.USAGE


def _target(ctx: Context) -> Path:
    """The file the gateway will read: ``--config`` or ``NEOTASK_CONFIG``, else ``<home>/config.yaml``."""
    explicit = getattr(ctx.args, "config", None) or ctx.env.get("NEOTASK_CONFIG")
    return Path(explicit).expanduser().resolve() if explicit else ctx.home / "config.yaml"


def _checked(config: LoadedConfig, env: Mapping[str, str]) -> list[str]:
    """``neotask config check``'s checks: its warnings; a refusal raises ``ConfigError``."""
    from gateway.validation import check_config, check_listening

    warnings = [*config.warnings, *check_config(config, env)]
    check_listening(config.settings.gateway.tokens, config.settings.gateway.host)
    return warnings


def check_model(config: LoadedConfig, env: Mapping[str, str]) -> str | None:
    """One chat completion from agent main's model, without retries: None when it answered, else why not."""
    from conversations.provider import ChatProvider, ProviderError

    model = config.settings.agents["main"].model
    model = model.model_copy(update={"max_retries": 0, "timeout_s": min(model.timeout_s, CHECK_MODEL_TIMEOUT_S)})

    async def one_request() -> None:
        provider = ChatProvider(model, api_key=env.get(model.api_key_env) or None, sdk_retries=0)
        try:
            await provider.complete([{"role": "user", "content": "Reply with the word OK."}], max_tokens=16)
        finally:
            await provider.close()

    try:
        asyncio.run(one_request())
    except ProviderError as exc:
        return exc.message
    return None


def _make_home(home: Path) -> int | None:
    """The home, private to the owner (0700); its old mode when it existed wider."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return tighten_root(home)


def _write(target: Path, text: str, *, replace_existing: bool) -> bool:
    """The file whole or not at all (0600); without ``replace_existing`` never over an existing one
    (a file that appeared meanwhile included): False then."""
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.init-{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        if replace_existing:
            os.replace(temporary, target)
        else:
            try:
                os.link(temporary, target)
            except FileExistsError:
                return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    return True


def _about_unset(warning: str, answers: Answers) -> bool:
    return any(f"{name} is not set" in warning or f"{name} not set" in warning for name, _ in answers.variables())


def _next_steps(ctx: Context, answers: Answers) -> str:
    where: list[str] = []
    if getattr(ctx.args, "home", None):
        where += ["--home", str(ctx.home)]
    if getattr(ctx.args, "config", None):
        where += ["--config", str(_target(ctx))]
    flags = "".join(f" {part}" for part in where)
    lines = ["", "next:"]
    for name, what in answers.variables():
        if not ctx.env.get(name):
            lines.append(f"  export {name}=...   # {what}")
    lines.append(f"  neotask gateway{flags}   # runs in the foreground (Ctrl-C stops it)")
    lines.append(f"then: neotask service install --user{flags}   # the same gateway as a systemd service")
    if answers.chat:
        lines.append("      message your bot: it answers with a pairing code; `neotask channels approve CODE`")
    if answers.matrix_homeserver:
        lines.append("      (Matrix: start a direct chat with the bot user; it joins, then answers)")
    return "\n".join(lines)
