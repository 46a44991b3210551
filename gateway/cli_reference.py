"""The CLI reference of the docs site, generated from the argparse parser ``neotask`` runs
(``gateway.cli.build_parser``): every command, with the help ``neotask COMMAND --help`` prints."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

WIDTH = 100  # the help text's width, fixed so the page does not depend on the terminal that builds it


def commands(parser: argparse.ArgumentParser) -> Iterator[tuple[list[str], str, argparse.ArgumentParser]]:
    """(words after ``neotask``, one-line help, parser) of every command and subcommand, depth first."""
    yield from _walk(parser, [], "")


def _walk(
    parser: argparse.ArgumentParser, words: list[str], text: str
) -> Iterator[tuple[list[str], str, argparse.ArgumentParser]]:
    yield words, text, parser
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, sub in action.choices.items():
            yield from _walk(sub, [*words, name], helps.get(name, ""))


def help_text(parser: argparse.ArgumentParser) -> str:
    """What ``--help`` prints, at a fixed width."""
    kept = parser.formatter_class
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=WIDTH)
    try:
        return parser.format_help()
    finally:
        parser.formatter_class = kept


def anchor(words: list[str]) -> str:
    """The heading's anchor, as the site's table of contents makes it from ``neotask a b``."""
    return "-".join(["neotask", *words])


def cli_markdown(parser: argparse.ArgumentParser) -> str:
    found = list(commands(parser))
    out = [
        "# CLI reference",
        "",
        "Generated from the parser `neotask` itself each time the site is built: every command with",
        "what `neotask COMMAND --help` prints. How the commands behave with and without a running",
        "daemon, and their exit statuses: [The command line](../cli.md).",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for words, text, _ in found[1:]:
        name = " ".join(["neotask", *words])
        out.append(f"| [`{name}`](#{anchor(words)}) | {text.replace('|', chr(92) + '|')} |")
    out.append("")
    for words, _, sub in found:
        name = " ".join(["neotask", *words])
        out += [f"## {name}", "", "```text", help_text(sub).rstrip(), "```", ""]
    return "\n".join(out).rstrip("\n") + "\n"
