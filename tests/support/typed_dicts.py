"""Whether a JSON object is one of the TypedDicts of a union (typed events, typed context lines):
its ``type`` or ``kind`` (and ``action``) where the TypedDict names their values, every required
key, and no key the TypedDict does not declare."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any


def _literal_values(hint: object) -> set[object]:
    return set(typing.get_args(hint)) if typing.get_origin(hint) is typing.Literal else set()


def matching_types(value: Mapping[str, Any], union: object) -> list[str]:
    """The names of the TypedDicts of ``union`` that ``value`` is."""
    found = []
    for cls in typing.get_args(union):
        hints = typing.get_type_hints(cls)
        if any(
            name in hints and (values := _literal_values(hints[name])) and value.get(name) not in values
            for name in ("type", "kind", "action", "role")
            if name in value or name in cls.__required_keys__
        ):
            continue
        keys = set(value)
        if cls.__required_keys__ <= keys <= cls.__required_keys__ | cls.__optional_keys__:
            found.append(cls.__name__)
    return found
