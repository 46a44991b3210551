"""The configuration reference of the docs site, generated from ``config/defaults.yaml`` (every
key, its default as written and the file's own comment on it) and the settings models (each key's
type and limits, and the fields of list and mapping entries such as ``channels.telegram.accounts``).

``configuration_markdown()`` refuses to build a page that misses a key of either: the file and
the models are the truth, the page only shows them.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from config.loader import defaults_text, load_defaults
from config.settings import Settings

_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")
_COMMENT = re.compile(r"\s#\s?(?P<text>.*)$")
OPAQUE = frozenset({"hooks"})  # a mapping of user-chosen names: its entries are described by their model


@dataclass
class Entry:
    """One key of defaults.yaml: its dotted path, its value as written and its comment."""

    path: str
    value: str
    comment: list[str] = field(default_factory=list)
    column: int = 0  # where the key starts; a comment line further right continues this key's comment


@dataclass
class Scan:
    preamble: list[str]
    entries: list[Entry]


def scan(text: str) -> Scan:
    """Every key of the YAML text in order, with its comment: the comment on its line, the comment
    lines right under it that start further right than the key, and a block of comment lines just
    above it (a block followed by a blank line belongs to the key before it)."""
    preamble: list[str] = []
    entries: list[Entry] = []
    stack: list[tuple[int, str]] = []
    block: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            if block:
                (entries[-1].comment if entries else preamble).extend(block)
                block = []
            continue
        if stripped.startswith("#"):
            column = len(line) - len(line.lstrip())
            text_part = stripped[1:].strip()
            if entries and not block and column > entries[-1].column:
                entries[-1].comment.append(text_part)
            else:
                block.append(text_part)
            continue
        match = _KEY_LINE.match(line)
        if match is None:
            raise ValueError(f"defaults.yaml: a line the reference cannot read: {line!r}")
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(key for _, key in stack), match["key"]])
        stack.append((indent, match["key"]))
        rest = match["rest"]
        comment = _COMMENT.search(rest)
        value = (rest[: comment.start()] if comment else rest).strip()
        entry = Entry(path, value, [*block, *([comment["text"].strip()] if comment else [])], indent)
        block = []
        entries.append(entry)
    if block:
        (entries[-1].comment if entries else preamble).extend(block)
    return Scan(preamble, entries)


def yaml_keys(data: dict[str, Any], prefix: str = "") -> set[str]:
    """Every key path of a defaults mapping (an empty mapping and ``hooks`` are leaves)."""
    keys = set()
    for name, value in data.items():
        path = f"{prefix}{name}"
        keys.add(path)
        if isinstance(value, dict) and value and path not in OPAQUE:
            keys |= yaml_keys(value, path + ".")
    return keys


def model_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every (path, field) of the settings models, sections included; the agents mapping as
    ``agents.main``, the agent defaults.yaml shows."""
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        yield path, info
        section = _section_model(info.annotation)
        if section is not None:
            yield from model_fields(section, path + ".")
        elif path == "agents":
            value = get_args(info.annotation)[1]
            yield "agents.main", FieldInfo.from_annotation(value)
            yield from model_fields(value, "agents.main.")


def _section_model(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def type_text(annotation: Any) -> str:
    """A field's type as a reader says it: ``int``, ``list of str``, ``auto | asyncio | uvloop``;
    the model of an entry as a link to its table."""
    origin = get_origin(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(str(a) for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " or ".join(type_text(a) for a in get_args(annotation))
    if origin in (tuple, list):
        return f"list of {type_text(get_args(annotation)[0])}"
    if origin is dict:
        key, value = get_args(annotation)
        return f"mapping of {type_text(key)} to {type_text(value)}"
    if _section_model(annotation) is not None:
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    return str(getattr(annotation, "__name__", annotation))


def limits_text(info: FieldInfo) -> str:
    signs = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    out = []
    for item in info.metadata:
        if isinstance(item, annotated_types.Ge | annotated_types.Gt | annotated_types.Le | annotated_types.Lt):
            name = type(item).__name__.lower()
            out.append(f"{signs[name]} {getattr(item, name)}")
    return ", ".join(out)


def entry_models(annotation: Any) -> list[type[BaseModel]]:
    """The models of a list's items or a mapping's values (``bindings``, ``cron.jobs``, ``hooks``,
    ``channels.*.accounts``, ``model.fallbacks``), and the models of their fields after them."""
    found: list[type[BaseModel]] = []
    model = _section_model(annotation)
    args = [annotation] if model is not None else list(get_args(annotation))
    for arg in args:
        model = _section_model(arg)
        if model is None:
            found.extend(m for m in entry_models(arg) if m not in found)
            continue
        if model not in found:
            found.append(model)
        for info in model.model_fields.values():
            found.extend(m for m in entry_models(info.annotation) if m not in found)
    return found


def cell(text: str) -> str:
    """Table cell text: ``|`` escaped and ``<...>`` shown, outside code spans."""
    parts = text.replace("``", "`").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


_LABEL = re.compile(r"^[a-z0-9_.+|/ -]+: ")  # a comment line that starts a new item: "always: one sync ..."


def comment_cell(lines: list[str]) -> str:
    """A key's comment lines as one cell: wrapped lines joined, a line that starts an item of its
    own (``always: ...``, ``mode: ...``) on a line of its own."""
    out = ""
    for line in lines:
        joiner = "<br>" if out and _LABEL.match(line) else " "
        out = f"{out}{joiner}{cell(line)}" if out else cell(line)
    return out


def code(text: str) -> str:
    return f"`{text}`" if text else ""


def _entry_table(model: type[BaseModel]) -> list[str]:
    doc = " ".join((model.__doc__ or "").split())
    rows = [f"### {model.__name__}", ""]
    if doc and not doc.startswith(("Usage docs", "!!!", "A base class")):
        rows += [cell(doc), ""]
    rows += ["| field | type | default | limits |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        default = "required" if info.is_required() else code(repr_default(info.get_default(call_default_factory=True)))
        rows.append(f"| `{name}` | {cell(type_text(info.annotation))} | {default} | {cell(limits_text(info))} |")
    return [*rows, ""]


def repr_default(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, tuple | list):
        return "[" + ", ".join(repr_default(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    return str(value)


def configuration_markdown() -> str:
    """The reference page; ``ValueError`` when defaults.yaml and the models do not list the same
    keys or the page would miss one."""
    scanned = scan(defaults_text())
    by_path = {entry.path: entry for entry in scanned.entries}
    fields = dict(model_fields(Settings))
    keys = yaml_keys(load_defaults())
    if set(by_path) != keys:
        raise ValueError(f"defaults.yaml read line by line and as YAML differ: {sorted(set(by_path) ^ keys)}")
    if keys != set(fields):
        raise ValueError(f"defaults.yaml and the settings models differ: {sorted(keys ^ set(fields))}")
    out = [
        "# Configuration reference",
        "",
        "Generated from `config/defaults.yaml` and the settings models (`config/settings.py`,",
        "`config/channels.py`) each time the site is built: every key with its default, its type and",
        "limits, and what it does. How the files, the environment and flags combine, and live reload:",
        "[Configuration](../configuration.md).",
        "",
        *(line for line in _paragraphs(scanned.preamble)),
        "",
    ]
    entry_sections: list[type[BaseModel]] = []
    for top in [e for e in scanned.entries if "." not in e.path]:
        section = _section_model(fields[top.path].annotation) is not None
        out += [f"## {top.path}", ""]
        if section and top.comment:
            out += [comment_cell(top.comment), ""]
        out += ["| key | default | type | limits | what it does |", "|---|---|---|---|---|"]
        for entry in scanned.entries:
            if not entry.path.startswith(top.path + ".") and not (entry.path == top.path and not section):
                continue
            info = fields[entry.path]
            kind = "section" if _section_model(info.annotation) else cell(type_text(info.annotation))
            if entry.path == "agents":
                kind = "mapping of agent id to an agent: the keys of `agents.main`"
            out.append(
                f"| `{entry.path}` | {code(entry.value)} | {kind} | {cell(limits_text(info))} "
                f"| {comment_cell(entry.comment)} |"
            )
            if entry.path != "agents":  # its entry is agents.main, in the table already
                entry_sections += [m for m in _entries_of(info.annotation) if m not in entry_sections]
        out.append("")
    out += [
        "## Entries of lists and mappings",
        "",
        "The fields of an entry of `bindings`, `cron.jobs`, `hooks`, `channels.*.accounts`,",
        "`session.reset_by_*`, `agents.<id>.model.fallbacks` and the other lists and mappings above.",
        "",
    ]
    for model in entry_sections:
        out += _entry_table(model)
    return "\n".join(out).rstrip("\n") + "\n"


def _entries_of(annotation: Any) -> list[type[BaseModel]]:
    """The entry models under a key: none for a section (its keys are rows of their own)."""
    return [] if _section_model(annotation) is not None else entry_models(annotation)


def _paragraphs(lines: list[str]) -> Iterator[str]:
    text = " ".join(line for line in lines if line)
    if text:
        yield cell(text)
